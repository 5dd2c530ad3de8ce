"""The whole app, driven like a user: the wizard launches real runs and the monitor follows them.

On the own server (the loopback sshd) the window is closed mid-run and a new one reattaches. Rented, the whole
journey: the wizard lists a fake cloud's offers, picks the cheapest that fits, asks once and rents it; the machine (a
real sshd on loopback) is terminated at the fake when the adapter is home; the adapter is on the Models page, is
exported to GGUF there and answers in the chat; what it cost is on the Costs page and in the tray's menu. The tiny
models train for real on the CPU.
"""

from __future__ import annotations

import asyncio
import getpass
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QHeaderView,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QWidget,
)
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.services.billing.spend import run_spend, spend_overview
from desktop.services.local.inventory import exports_folder
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import installation_id
from desktop.services.providers.base import ProviderName
from desktop.services.runs.drafts import load_draft
from desktop.services.runs.engine import EngineOptions
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.cost_words import money
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.chat_page import ChatPage
from desktop.ui.pages.costs_page import CostsPage
from desktop.ui.pages.models_page import ModelsPage
from desktop.ui.pages.wizard.compute_step import ComputeStep
from desktop.ui.pages.wizard.data_step import DataStep
from desktop.ui.pages.wizard.model_step import ModelStep
from desktop.ui.pages.wizard.review_step import ReviewStep
from desktop.ui.widgets.launch_dialog import LAUNCH_BUTTON
from desktop.ui.widgets.local_dialogs import ExportDialog
from tests.fakes.http import FakeCloud
from tests.fixtures.chat_data import SYSTEM_PROMPT
from tests.fixtures.sshd import SshHost
from tests.fixtures.tiny_models import TinyModel
from tests.local.test_chat import direct_answer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # two real runs, on a loaded machine too


def open_window(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> MainWindow:
    context = AppContext(Settings(), SecretStore(), engine_options=EngineOptions(poll_seconds=0.2))
    window = MainWindow(context.settings, context.secrets, context)
    qtbot.addWidget(window)
    window.show()
    window.activateWindow()  # mnemonics (Alt+N) and shortcuts act on the active window
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window)
    qloop.run_until_complete(window.load_pages())
    return window


def type_into(qtbot: QtBot, field: QLineEdit, text: str) -> None:
    """Focuses a field and types, as a user would."""
    field.setFocus()
    field.selectAll()
    qtbot.keyClicks(field, text)


def activate_by_keyboard(qtbot: QtBot, window: MainWindow, button: QAbstractButton) -> None:
    """Tabs to a button as a keyboard user would (failing if Tab never gets there), then presses Space."""
    for _ in range(80):
        if QApplication.focusWidget() is button:
            qtbot.keyClick(button, Qt.Key.Key_Space)
            return
        qtbot.keyClick(QApplication.focusWidget() or window, Qt.Key.Key_Tab)
    raise AssertionError(f"Tab never reached {button.text()!r}")


def press_next(qtbot: QtBot, window: MainWindow) -> None:
    """Next, reached with Tab and pressed with Space."""
    before = window.wizard.current
    activate_by_keyboard(qtbot, window, window.wizard.next_button)
    assert window.wizard.current is not before, window.wizard.problem_label.text()


def fill_data(qtbot: QtBot, window: MainWindow, wait_for: Callable[..., None], dataset: Path) -> None:
    step = window.wizard.current
    assert isinstance(step, DataStep)
    type_into(qtbot, step.path_edit, str(dataset))
    qtbot.keyClick(step.path_edit, Qt.Key.Key_Return)
    wait_for(lambda: not step.running and step.check is not None, 60)
    assert step.validate() is None


def fill_model(qtbot: QtBot, window: MainWindow, model: Path, epochs: int = 5) -> None:
    step = window.wizard.current
    assert isinstance(step, ModelStep)
    type_into(qtbot, step.model_edit, str(model))
    step.method_buttons["lora"].click()
    step.advanced_toggle.click()
    for key, value in {"seq_len": 128, "micro_batch": 4, "grad_accum": 1, "epochs": epochs, "lora_r": 8}.items():
        step.spins[key].setValue(value)
    step.spins["learning_rate"].setValue(0.003)


def accept_the_question(asked: list[str]) -> None:
    """Presses the launch button of the confirmation as soon as it is up (it runs its own event loop), keeping its
    words in ``asked``."""

    def press() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(50, press)
            return
        asked.append(f"{box.text()}\n{box.informativeText()}")
        button = box.findChild(QPushButton, LAUNCH_BUTTON)
        assert button is not None
        button.click()

    QTimer.singleShot(50, press)


def fill_own_server(
    qtbot: QtBot, window: MainWindow, wait_for: Callable[..., None], host: SshHost, remote: Path
) -> None:
    compute = window.wizard.current
    assert isinstance(compute, ComputeStep)
    activate_by_keyboard(qtbot, window, compute.own_button)
    assert compute.own_form.isVisible() and not compute.rent_panel.isVisible()
    step = compute.own_form
    type_into(qtbot, step.host_edit, host.host)
    step.port_spin.setValue(host.port)
    type_into(qtbot, step.user_edit, host.user)
    type_into(qtbot, step.key_edit, str(host.client_key))
    type_into(qtbot, step.python_edit, sys.executable)
    type_into(qtbot, step.workdir_edit, str(remote))
    type_into(qtbot, step.authorized_edit, str(host.server.directory / "authorized_keys"))
    step.rate_spin.setValue(2.4)
    activate_by_keyboard(qtbot, window, step.test_button)
    wait_for(lambda: step.host_key != "", 30)


def test_the_wizard_launches_a_run_the_monitor_follows_and_a_new_window_reattaches(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    ssh_host: SshHost,
    tiny_model: TinyModel,
    chat_dataset: Path,
    tmp_path: Path,
) -> None:
    window = open_window(qtbot, qloop)
    window.show_page("new")
    fill_data(qtbot, window, wait_for, chat_dataset)
    press_next(qtbot, window)
    fill_model(qtbot, window, tiny_model.path)
    press_next(qtbot, window)
    assert window.wizard.current.step_name == "sizing"
    wait_for(lambda: window.wizard.current.validate() is None, 60)
    press_next(qtbot, window)
    fill_own_server(qtbot, window, wait_for, ssh_host, tmp_path / "remote")
    press_next(qtbot, window)
    review = window.wizard.current
    assert isinstance(review, ReviewStep)
    assert load_draft().target.host_key, "the wizard's state is saved as it goes"
    wait_for(lambda: review.facts is not None and not review.refreshing, 60)
    assert [check.headline for check in review.red_checks] == ["Your server has no GPU"]
    assert not review.launch_button.isEnabled(), "the CPU-only server blocks Launch"
    asked: list[str] = []
    accept_the_question(asked)
    activate_by_keyboard(qtbot, window, review.launch_anyway_button)
    assert len(asked) == 1 and "Launching despite: Your server has no GPU." in asked[0]
    wait_for(lambda: window.stack.currentWidget() is window.monitor, 30)
    monitor = window.monitor
    run_id = monitor.run_id
    assert run_id is not None
    wait_for(lambda: len(monitor.progress.losses) >= 2, 120)
    assert (RunStore().folder(run_id) / "SPEC.toml").is_file()

    window.close()  # the app quits mid-run; training goes on on the machine
    qloop.run_until_complete(window.context.manager.close())
    assert RunStore().get(run_id).state is not RunState.FINISHED, "closed mid-run: nobody follows it now"
    second = open_window(qtbot, qloop)  # reattaches: only a follower can bring the run to finished
    assert second.status_label.text().startswith("Reattached to 1 live run")
    second.on_run_opened(run_id)
    wait_for(lambda: RunStore().get(run_id).state is RunState.FINISHED, 240)
    record = RunStore().get(run_id)
    assert record.adapter and (Path(record.adapter) / "adapter_model.safetensors").is_file()
    wait_for(lambda: Path(record.adapter).name in second.monitor.stats["adapter"].text(), 10)
    assert second.monitor.progress.losses, "the monitor shows the curve of the finished run"
    second.show_page("runs")
    wait_for(lambda: second.runs_page.table.rowCount() == 1, 10)
    qloop.run_until_complete(second.context.manager.close())


@pytest.fixture
def runpod(fake_runpod: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> FakeCloud:
    """The fake RunPod served over HTTP with a key in the environment; the other clouds have no key."""
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", fake_runpod.serve())
    monkeypatch.setenv("RUNPOD_API_KEY", fake_runpod.valid_key)
    for variable in ("VAST_API_KEY", "LAMBDA_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    return fake_runpod


def test_the_journey_rent_the_cheapest_fit_train_export_to_gguf_chat_and_see_the_cost(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    runpod: FakeCloud,
    gguf_tiny_model: Path,
    chat_dataset: Path,
) -> None:
    window = open_window(qtbot, qloop)
    window.show_page("new")
    fill_data(qtbot, window, wait_for, chat_dataset)
    press_next(qtbot, window)
    fill_model(qtbot, window, gguf_tiny_model, epochs=4)  # enough for the fine-tune to answer sums
    press_next(qtbot, window)
    wait_for(lambda: window.wizard.current.validate() is None, 60)
    press_next(qtbot, window)
    compute = window.wizard.current
    assert isinstance(compute, ComputeStep) and compute.renting, "renting is where a new run starts"
    wait_for(lambda: not compute.fetching and compute.judged is not None, 60)
    assert compute.keys_panel.rows[ProviderName.RUNPOD].badge.text().endswith("offers")
    assert compute.keys_panel.rows[ProviderName.VAST].key_button.text() == "Add key"
    shown = compute.offers.items
    cheapest = min((item for item in shown if item.fits), key=lambda item: item.total_usd or 0.0)
    assert compute.pick is not None and compute.pick.key == cheapest.key, "the cheapest that fits is picked"
    assert compute.pick.offer.gpu == "RTX 4090" and not compute.pick.offer.spot
    activate_by_keyboard(qtbot, window, compute.machine_toggle)
    type_into(qtbot, compute.python_edit, sys.executable)  # the fake's machines are this computer's sshd
    type_into(qtbot, compute.user_edit, getpass.getuser())
    press_next(qtbot, window)
    review = window.wizard.current
    assert isinstance(review, ReviewStep)
    wait_for(lambda: review.facts is not None and not review.refreshing, 60)
    assert review.red_checks == [] and review.launch_button.isEnabled()
    assert "Price: $0.44 per hour" in review.section_text("compute")
    assert runpod.instances == {}, "nothing is rented before the question is answered"
    asked: list[str] = []
    accept_the_question(asked)
    activate_by_keyboard(qtbot, window, review.launch_button)
    (question,) = asked
    assert "Rent 1 x RTX 4090 (24 GiB) from RunPod (on-demand) at $0.44 per hour" in question
    assert f"${cheapest.total_usd:,.2f} in all" in question and "No budget" in question
    wait_for(lambda: window.stack.currentWidget() is window.monitor, 30)
    run_id = window.monitor.run_id
    assert run_id is not None
    wait_for(lambda: bool(runpod.instances), 60)
    (machine,) = runpod.instances.values()
    assert machine.label == f"rentune-{installation_id()}-{run_id}" and machine.price_per_hour == 0.44
    assert machine.extra["body"]["gpu"]["id"] == "NVIDIA GeForce RTX 4090"
    wait_for(lambda: RunStore().get(run_id).state is RunState.FINISHED, 200)
    record = RunStore().get(run_id)
    assert record.adapter and (Path(record.adapter) / "adapter_model.safetensors").is_file()
    wait_for(lambda: machine.terminated is not None, 60)
    assert not runpod.pool.alive(machine.id), "the machine is gone once the adapter is home"
    assert review.launched_run == run_id
    gguf = export_on_the_models_page(window, wait_for, run_id)
    chat_with(window, qtbot, wait_for, gguf)
    see_the_cost(window, wait_for, run_id)
    chat = window.page("chat")
    assert isinstance(chat, ChatPage)
    qloop.run_until_complete(chat.close_models())
    qloop.run_until_complete(window.context.manager.close())


def export_on_the_models_page(window: MainWindow, wait_for: Callable[..., None], run_id: str) -> Path:
    """Finds the run's adapter on the Models page and exports it to GGUF (Q8_0) there; returns the file."""
    window.show_page("models")
    page = window.page("models")
    assert isinstance(page, ModelsPage)
    wait_for(lambda: page.tree.topLevelItemCount() == 1, 30)  # read again as the page comes into view
    adapter = page.tree.topLevelItem(0)
    assert adapter.text(0).startswith(f"Run {run_id}") and adapter.text(1) == "LoRA adapter"
    page.tree.setCurrentItem(adapter)
    page.export_button.click()
    dialog = page.dialog
    assert isinstance(dialog, ExportDialog) and dialog.gguf_check.isChecked()
    dialog.type_checks["Q4_K_M"].setChecked(False)
    dialog.type_checks["Q8_0"].setChecked(True)
    dialog.base_gguf_check.setChecked(False)
    dialog.start_button.click()
    wait_for(lambda: page.task is None, 600)
    gguf = exports_folder(run_id) / "model-Q8_0.gguf"
    assert gguf.read_bytes()[:4] == b"GGUF", page.banner.details_label.text()
    wait_for(page.chat_button.isEnabled, 30)  # the new file is listed and selected
    page.chat_button.click()
    return gguf


def chat_with(window: MainWindow, qtbot: QtBot, wait_for: Callable[..., None], gguf: Path) -> None:
    """The chat opened from the Models page answers as llama.cpp itself does with the exported file."""
    chat = window.page("chat")
    assert isinstance(chat, ChatPage) and window.stack.currentWidget() is chat
    column = chat.columns[0]
    wait_for(lambda: column.badge.text() == "Ready", 120)
    chat.temperature_spin.setValue(0)
    chat.tokens_spin.setValue(16)
    type_into(qtbot, chat.system_edit, SYSTEM_PROMPT)
    question = "What is two plus three?"  # the fine-tune learnt to answer sums
    type_into(qtbot, chat.prompt, question)
    qtbot.keyClick(chat.prompt, Qt.Key.Key_Return)
    wait_for(lambda: not chat.answering, 120)
    assert question in column.text()
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    expected = direct_answer(gguf, messages, 16)
    assert expected.strip() and column.last_answer() == expected


def see_the_cost(window: MainWindow, wait_for: Callable[..., None], run_id: str) -> None:
    """The run's dollars on the Costs page, and the day's and month's in the tray's menu, match the ledger."""
    spent = run_spend(RunStore(), run_id)
    assert spent.rented and not spent.billing and spent.usd > 0
    window.show_page("costs")
    page = window.page("costs")
    assert isinstance(page, CostsPage)

    def run_row() -> list[str]:
        table = page.run_table
        rows = [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]
        return next((row for row in rows if row[0] == run_id), [])

    # RunPod reports no end time: the machine's end is when Rentune saw it gone, marked as an estimate
    wait_for(lambda: run_row()[2:5] == ["RunPod", "Finished", f"{money(spent.usd)} est."], 30)
    overview = spend_overview(RunStore())
    assert page.total_card.value_label.text() == money(overview.total_usd) == money(spent.usd)
    menu = window.cost_tracker.status_meter.menu.items
    assert menu[0].text == f"Today {money(overview.today_usd)} · This month {money(overview.month_usd)}"
    assert not [item for item in menu if item.kind == "stop"], "nothing bills any more"


def focusable(widget: QWidget) -> list[QWidget]:
    """Interactive widgets on a step that a keyboard user must reach."""
    kinds = (QLineEdit, QAbstractButton, QAbstractSpinBox, QAbstractItemView, QComboBox)
    return [
        w
        for w in widget.findChildren(QWidget)
        if isinstance(w, kinds)
        and not isinstance(w.parentWidget(), (QAbstractSpinBox, QComboBox, QAbstractItemView))  # parts of a named one
        and not isinstance(w, QHeaderView)
        and w.isVisibleTo(widget)
        and w.isEnabled()
    ]


@pytest.mark.parametrize("step_name", ["data", "model", "sizing", "compute", "review"])
def test_every_wizard_step_is_reachable_by_tab_and_named_for_screen_readers(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, step_name: str
) -> None:
    window = open_window(qtbot, qloop)
    window.show_page(step_name)
    step = window.wizard.current
    assert step.step_name == step_name
    widgets = focusable(step)
    unnamed = [w for w in widgets if not (w.accessibleName() or (isinstance(w, QAbstractButton) and w.text()))]
    assert not unnamed, f"no accessible name: {[(type(w).__name__, w.objectName()) for w in unnamed]}"
    step.setFocus()
    reached: set[int] = set()
    for _ in range(len(widgets) * 3 + 10):
        QApplication.focusWidget() and reached.add(id(QApplication.focusWidget()))  # type: ignore[func-returns-value]
        qtbot.keyClick(QApplication.focusWidget() or step, Qt.Key.Key_Tab)
    missing = [
        w.accessibleName() or w.objectName()
        for w in widgets
        if id(w) not in reached and w.focusPolicy() & Qt.FocusPolicy.TabFocus
    ]
    assert not missing, f"not reachable with Tab: {missing}"


def test_a_reopened_wizard_continues_where_the_user_left(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tiny_model: TinyModel
) -> None:
    window = open_window(qtbot, qloop)
    window.show_page("model")
    step = window.wizard.current
    assert isinstance(step, ModelStep)
    type_into(qtbot, step.model_edit, str(tiny_model.path))
    window.show_page("compute")  # leaving a step saves it
    window.close()
    draft: RunDraft = load_draft()
    assert draft.base_model == str(tiny_model.path) and draft.step == "compute"
    again = open_window(qtbot, qloop)
    assert again.wizard.current.step_name == "compute"
    again.show_page("model")
    reopened = again.wizard.current
    assert isinstance(reopened, ModelStep) and reopened.model_edit.text() == str(tiny_model.path)
