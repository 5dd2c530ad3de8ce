"""The cost tracker: the menu the tray shows (here in the status bar: offscreen has no tray), Stop through the run
manager and at the provider, notices once each, closing while something bills, and starting at login."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSystemTrayIcon
from pytestqt.qtbot import QtBot

from desktop.cli.parser import build_parser
from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.meter import read_meter
from desktop.services.billing.spend import run_spend
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import load_settings
from desktop.services.providers.base import Instance, OfferQuery, ProviderName, RentRequest
from desktop.services.providers.registry import open_provider
from desktop.services.runs.store import RunStore
from desktop.ui import app as app_module
from desktop.ui import status, tray
from desktop.ui.app import GuiOptions
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.settings_page import SettingsPage
from desktop.ui.status import summary_line
from desktop.ui.tray import MenuItem, menu_model
from tests.fakes.http import FakeCloud
from tests.fixtures.recorded_costs import backdated_run, seed_spending

KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf2lCXjVHZmIeOaVG7CXHPBBpU1KLdmkLmNbdzN8YKc tracker"
HOUR = 3600.0


async def _rent(label: str) -> Instance:
    provider = open_provider(ProviderName.RUNPOD)
    try:
        [offer, *_] = await provider.offers(OfferQuery(gpu="RTX 4090"))
        return await provider.create(RentRequest(offer, KEY_LINE, label, "img"))
    finally:
        await provider.aclose()


@pytest.fixture
def runpod(fake_runpod: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> FakeCloud:
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", fake_runpod.serve())
    monkeypatch.setenv("RUNPOD_API_KEY", fake_runpod.valid_key)
    return fake_runpod


def _record_rented_run(store: RunStore, instance: Instance, budget: float = 0.0) -> str:
    """A run training on ``instance`` (rented 20 min ago), as the rental driver records one."""
    start = time.time() - 20 * 60
    rental = {
        "provider": "runpod",
        "instance_id": instance.instance_id,
        "gpu": "RTX 4090",
        "price_per_hour": instance.price_per_hour,
        "spot": False,
        "offer_id": "o",
        "created": start,
        "ready": start + 60,
    }
    spec = {
        "base_model": "tiny-llama",
        "compute": asdict(ComputeSpec(provider="runpod", gpu="RTX 4090")),
        "rental": rental,
        "hourly_rate_usd": instance.price_per_hour,
        "budget_usd": budget,
    }
    history = [(RunState.PLANNED, start - 5), (RunState.PROVISIONING, start), (RunState.TRAINING, time.time())]
    run_id = backdated_run(store, spec, history, "ssh://root@127.0.0.1:2222")
    Ledger().open(run_id, "runpod", instance.instance_id, "RTX 4090", instance.price_per_hour, started=start)
    return run_id


def _window(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> MainWindow:
    window = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    qloop.run_until_complete(window.load_pages(follow_runs=False))
    return window


def _stop_entry(window: MainWindow) -> MenuItem:
    return next(item for item in window.cost_tracker.status_meter.menu.items if item.kind == "stop")


def test_the_menu_model_shows_spend_each_machine_with_its_rate_open_and_quit() -> None:
    seeded = seed_spending()
    reading = read_meter(RunStore())
    items = menu_model(reading)
    kinds = [item.kind for item in items]
    assert kinds == ["info", "info", "separator", "stop", "stop", "separator", "open", "costs", "separator", "quit"]
    assert items[0].text.startswith("Today $") and " · This month $" in items[0].text
    assert items[1].text == "Billing $0.94/h now (2 machines)"
    live, leftover = items[3], items[4]
    assert live.text == f"Stop run {seeded.live_run} (RunPod RTX 4090, $0.69/h)…"
    assert leftover.text == "Terminate Vast.ai RTX 3090 ($0.25/h, no run uses it)…"
    assert [i.kind for i in menu_model(reading, in_window=True)][-2:] == ["separator", "costs"]
    assert [i.text for i in menu_model(None)][:1] == ["Reading what was spent…"]


def test_a_running_rented_machine_is_in_the_menu_and_stop_terminates_it_at_the_provider(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    runpod: FakeCloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instance = qloop.run_until_complete(_rent("rentune-pending"))
    store = RunStore()
    run_id = _record_rented_run(store, instance)
    window = _window(qtbot, qloop)
    tracker = window.cost_tracker
    assert not tracker.has_tray, "offscreen has no tray: the meter is in the status bar"
    wait_for(tracker.status_meter.button.isEnabled)
    assert tracker.status_meter.label.text().endswith(" · $0.69/h now")
    entry = _stop_entry(window)
    assert entry.text == f"Stop run {run_id} (RunPod RTX 4090, $0.69/h)…"
    asked: list[str] = []
    monkeypatch.setattr(tray, "confirm", lambda _parent, _title, question, *_buttons: asked.append(question) or True)
    action = tracker.status_meter.menu.action_for("stop")
    assert action is not None
    action.trigger()
    wait_for(lambda: runpod.instances[instance.instance_id].terminated is not None, timeout=30)
    wait_for(lambda: not tracker.status_meter.button.isEnabled(), timeout=15)
    assert asked and "The trainer saves a checkpoint" in asked[0] and "$0.69/h" in asked[0]
    assert store.get(run_id).state is RunState.CANCELLED
    rental = Ledger().get("runpod", instance.instance_id)
    assert rental is not None and rental.stopped is not None
    assert ("Run stopped", f"Run {run_id} is cancelled.", "success") in tracker.said


def test_an_orphan_found_at_start_is_announced_and_terminated_after_asking(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    runpod: FakeCloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orphan = qloop.run_until_complete(_rent("rentune-20200101-000000-dead"))
    window = _window(qtbot, qloop)
    tracker = window.cost_tracker
    qloop.run_until_complete(window.check_orphans())
    wait_for(lambda: any(title == "Machines billing for nothing" for title, _, _ in tracker.said))
    wait_for(tracker.status_meter.button.isEnabled)
    assert "1 rented machine that no run uses bills $0.69/h" in window.status_label.text()
    entry = _stop_entry(window)
    assert entry.text == "Terminate RunPod RTX 4090 ($0.69/h, no run uses it)…"
    answers = iter([False, True])
    asked: list[str] = []
    monkeypatch.setattr(tray, "confirm", lambda _p, _t, question, *_buttons: asked.append(question) or next(answers))
    tracker.on_stop_requested(entry.machine)  # asked, and told no: nothing happens
    qloop.run_until_complete(asyncio.sleep(0.3))
    assert runpod.instances[orphan.instance_id].terminated is None
    tracker.on_stop_requested(entry.machine)
    wait_for(lambda: runpod.instances[orphan.instance_id].terminated is not None, timeout=30)
    assert "No Rentune run uses it" in asked[1]
    wait_for(lambda: not tracker.status_meter.button.isEnabled(), timeout=15)
    assert tracker.said.count(next(s for s in tracker.said if s[0] == "Machines billing for nothing")) == 1


def test_budget_thresholds_are_notified_once_each(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> None:
    store = RunStore()
    spec = {"hourly_rate_usd": 30 * 3600.0, "budget_usd": 90.0, "base_model": "m"}  # $30 a second: 3 s to spend
    record = store.create(spec, "ssh://me@box:22")
    window = _window(qtbot, qloop)
    tracker = window.cost_tracker
    store.transition(record.id, RunState.CONNECTING)
    store.transition(record.id, RunState.TRAINING)

    def budget_titles() -> list[str]:
        return [title for title, _, _ in tracker.said if "budget" in title.lower()]

    async def read_until_spent() -> None:
        while "Budget reached" not in budget_titles():
            await tracker.meter.refresh(again=True).wait()
            await asyncio.sleep(0.2)
        for _ in range(3):  # and on: nothing is said twice
            await tracker.meter.refresh(again=True).wait()

    qloop.run_until_complete(asyncio.wait_for(read_until_spent(), 60))
    titles = budget_titles()
    assert titles[-1] == "Budget reached" and titles.count("Budget reached") == 1
    assert set(titles) <= {"50 % of the budget spent", "80 % of the budget spent", "Budget reached"}
    assert len(titles) == len(set(titles)), "each threshold once"
    assert f"Run {record.id} (m) has spent" in window.status_label.text()


def test_notifications_off_in_settings_say_nothing(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, runpod: FakeCloud
) -> None:
    qloop.run_until_complete(_rent("rentune-20200101-000000-dead"))
    window = MainWindow(Settings(notifications=False), SecretStore())
    qtbot.addWidget(window)
    qloop.run_until_complete(window.load_pages(follow_runs=False))
    qloop.run_until_complete(window.check_orphans())
    qloop.run_until_complete(window.cost_tracker.meter.refresh(again=True).wait())
    assert window.cost_tracker.meter.latest is not None and window.cost_tracker.meter.latest.machines
    assert window.cost_tracker.said == []


def test_closing_while_billing_asks_and_names_what_keeps_running(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    runpod: FakeCloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instance = qloop.run_until_complete(_rent("rentune-pending"))
    run_id = _record_rented_run(RunStore(), instance)
    window = _window(qtbot, qloop)
    window.cost_tracker.guard_close = True  # as the running app does (tests and screenshots close plainly)
    closed: list[bool] = []
    window.sig_closed.connect(lambda: closed.append(True))
    answers = iter([False, True])
    asked: list[list[str]] = []
    monkeypatch.setattr(tray, "ask_quit", lambda _parent, lines: asked.append(lines) or next(answers))
    window.close()
    assert window.isVisible() and closed == [], "the user chose to keep Rentune open"
    [lines] = asked
    assert lines == [f"Run {run_id} (tiny-llama) keeps training on RunPod RTX 4090, billing $0.69/h."]
    headline, details = tray.quit_question(lines)
    assert headline == "Quit Rentune while something still runs?"
    assert "rented machines keep billing until their run ends" in details
    window.close()
    assert closed == [True] and not window.isVisible()


def test_closing_with_nothing_running_quits_without_a_question(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = _window(qtbot, qloop)
    window.cost_tracker.guard_close = True
    monkeypatch.setattr(tray, "ask_quit", lambda *_: pytest.fail("asked although nothing runs"))
    closed: list[bool] = []
    window.sig_closed.connect(lambda: closed.append(True))
    window.close()
    assert closed == [True]


def test_with_a_tray_closing_hides_the_window_explains_once_and_quit_asks(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    runpod: FakeCloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    instance = qloop.run_until_complete(_rent("rentune-pending"))
    run_id = _record_rented_run(RunStore(), instance)
    window = _window(qtbot, qloop)
    tracker = window.cost_tracker
    assert tracker.has_tray and tracker.tray.menu.action_for("open") is not None
    qloop.run_until_complete(tracker.meter.refresh(again=True).wait())
    assert tracker.tray.icon is not None and "$0.69/h" in tracker.tray.icon.toolTip()
    assert tracker.tray.menu.action_for("stop") is not None
    tracker.guard_close = True
    closed: list[bool] = []
    window.sig_closed.connect(lambda: closed.append(True))
    window.close()
    assert not window.isVisible() and closed == [], "hidden to the tray, still running"
    window.cost_tracker.on_open()
    window.close()
    explained = [text for title, text, _ in tracker.said if title == "Rentune is still running"]
    assert len(explained) == 1, "the explanation is given once"
    asked: list[list[str]] = []
    monkeypatch.setattr(tray, "ask_quit", lambda _parent, lines: asked.append(lines) or True)
    quit_action = tracker.tray.menu.action_for("quit")
    assert quit_action is not None
    quit_action.trigger()
    assert asked and run_id in asked[0][0] and closed == [True]


def test_start_at_login_writes_and_removes_the_autostart_file(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    entry = tmp_path / "xdg" / "autostart" / "rentune.desktop"
    window = _window(qtbot, qloop)
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    assert not page.login_check.isChecked() and page.notify_check.isChecked()
    page.login_check.setChecked(True)
    page.save_button.click()
    wait_for(lambda: page.preferences_status.text().startswith("Saved"))
    assert entry.is_file() and "--minimized" in entry.read_text()
    assert load_settings().start_at_login
    page.preferences_status.setText("")
    page.login_check.setChecked(False)
    page.save_button.click()
    wait_for(lambda: page.preferences_status.text().startswith("Saved"))
    assert not entry.exists() and not load_settings().start_at_login


def test_the_status_line_counts_a_rented_run_from_the_ledger_not_its_stated_rate() -> None:
    store = RunStore()
    start = time.time() - HOUR
    compute = asdict(ComputeSpec(provider="runpod", gpu="RTX 4090"))
    spec = {"compute": compute, "hourly_rate_usd": 99.0, "base_model": "m"}  # a stale rate: the ledger decides
    history = [(RunState.PLANNED, start - 5), (RunState.PROVISIONING, start), (RunState.TRAINING, start + 60)]
    run_id = backdated_run(store, spec, history, "ssh://root@10.0.0.9:22")
    Ledger().open(run_id, "runpod", "pod-x", "RTX 4090", 0.69, started=start)
    line = summary_line(read_meter(store))
    assert line == "Running: training on RunPod RTX 4090 at $0.69/h · $0.69 so far"
    assert f"${run_spend(store, run_id).usd:,.2f}" == "$0.69"


def test_the_status_line_names_the_machine_billing_for_a_run_still_being_set_up() -> None:
    store = RunStore()
    start = time.time() - 600
    compute = asdict(ComputeSpec(provider="runpod", gpu="RTX 3090"))
    run_id = backdated_run(store, {"compute": compute, "base_model": "m"}, [(RunState.PLANNED, start)], None)
    Ledger().open(run_id, "runpod", "pod-y", "RTX 3090", 0.22, started=start)
    line = summary_line(read_meter(store))
    # it said "planned on no machine yet" while the machine billed $0.22/h
    assert line.startswith("Running: renting on RunPod RTX 3090 at $0.22/h · $0.0"), line


def test_started_minimised_without_a_tray_the_window_starts_minimised(qtbot: QtBot) -> None:
    assert build_parser().parse_args(["--minimized"]).minimized
    window = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(window)
    app_module._show(window, GuiOptions(minimized=True))
    assert window.isMinimized() or window.windowState() & Qt.WindowState.WindowMinimized
    plain = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(plain)
    app_module._show(plain, GuiOptions(minimized=True, screenshot=Path("x.png")))  # a render always shows it
    assert plain.isVisible() and not plain.isMinimized()


def test_a_one_off_message_stays_a_while_before_the_running_line_returns(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore()
    record = store.create({"hourly_rate_usd": 1.0}, "ssh://me@box:22")
    store.transition(record.id, RunState.TRAINING)
    window = _window(qtbot, qloop)
    window.status_label.setText("Reattached to 1 live run(s); their checkpoints keep coming home.")
    qloop.run_until_complete(window.cost_tracker.meter.refresh(again=True).wait())
    assert window.status_label.text().startswith("Reattached to 1 live run")
    monkeypatch.setattr(status, "HOLD_S", 0.0)
    qloop.run_until_complete(window.cost_tracker.meter.refresh(again=True).wait())
    assert window.status_label.text() == "Running: training on your server me@box:22"


def test_stopping_a_cluster_says_every_machine_of_it_goes() -> None:
    from desktop.services.billing.meter import BillingMachine

    cluster = BillingMachine("runpod", "cluster:c1", "3 machines x 8x B200", 143.76, 60.0, "20261205-0842-a", True, 3)
    title, words = tray.stop_question(cluster)
    assert title == "Stop run" and "then all 3 machines are terminated and the run ends" in words
    orphan = BillingMachine("runpod", "cluster:c2", "2 machines x 8x H100", 80.0, 5.0, None, False, 2)
    assert "All 2 machines and their disks are deleted at RunPod" in tray.stop_question(orphan)[1]
    single = BillingMachine("vast", "v-1", "RTX 4090", 0.41, 0.2, "20261205-0842-b", True)
    assert "then the machine is terminated and the run ends" in tray.stop_question(single)[1]
