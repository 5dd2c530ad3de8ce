"""The run monitor on real run folders: a real RunStore, an events.jsonl appended while the page polls, real actions."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import shiboken6
from PySide6.QtCore import QEvent, QObject, QUrl, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from desktop.core.runs.spec import SshTarget
from desktop.core.runs.states import LIVE, RunState
from desktop.core.settings import Settings, Theme
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.spend import run_spend
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.cluster import cluster_of
from desktop.services.runs.engine import EngineOptions
from desktop.services.runs.store import RunStore
from desktop.services.runs.transfer import UPLOAD_PROGRESS_NAME, UploadMeter
from desktop.ui.context import AppContext
from desktop.ui.cost_words import money
from desktop.ui.design.palette import DARK, LIGHT
from desktop.ui.pages import monitor_page
from desktop.ui.pages.monitor_page import MonitorPage, read_event_chunk
from desktop.ui.theme import apply_theme
from desktop.ui.widgets.loss_chart import EMPTY_TEXT, loss_axis_range, step_axis_end
from tests.fixtures.fake_machine import FakeHost
from tests.fixtures.recorded_run import record_finished_run, record_live_rented_run, seal
from tests.fixtures.tracker_logs import write_trackio_database
from trainer_payload.protocol import CHECKPOINT_MARKER, EVENTS_FILE_NAME, EventKind, EventWriter

FLOW = [RunState.CONNECTING, RunState.UPLOADING, RunState.BOOTSTRAPPING, RunState.TRAINING]
#: Words of the raw event dump the log must never show.
RAW_WORDS = ("detail=", "ready_seconds", "[failed]", "SIGTERM", "stopped_by", "{")


def closed_port() -> int:
    """A loopback port nothing listens on: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def context(qloop: asyncio.AbstractEventLoop) -> Iterator[AppContext]:
    ctx = AppContext(Settings(), SecretStore(), engine_options=EngineOptions(poll_seconds=0.05, grace_seconds=0.3))
    yield ctx
    qloop.run_until_complete(ctx.manager.close())


@pytest.fixture
def page(
    qtbot: QtBot, context: AppContext, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> Iterator[MonitorPage]:
    widget = MonitorPage(context)
    qtbot.addWidget(widget)
    widget.resize(1080, 780)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    widget.hide()  # stops polling; readings already asked for finish while the loop still runs
    qloop.run_until_complete(asyncio.sleep(0.05))
    wait_for(lambda: not widget._refreshing)


def make_run(store: RunStore, states: list[RunState], rate: float = 0.0, target: str | None = None) -> str:
    spec = {"base_model": "tiny-llama", "training": {"method": "lora"}, "hourly_rate_usd": rate}
    run_id = store.create(spec, target or f"ssh://me@127.0.0.1:{closed_port()}").id
    for state in states:
        store.transition(run_id, state)
    return run_id


def events_of(store: RunStore, run_id: str) -> Path:
    return store.folder(run_id) / EVENTS_FILE_NAME


def append(path: Path, *events: dict[str, Any]) -> None:
    """Appends events the way the engine mirrors them: one JSON object per line."""
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(event) + "\n" for event in events)


def step_event(seq: int, ts: float, number: int, **extra: Any) -> dict[str, Any]:
    return {
        "ts": ts,
        "seq": seq,
        "event": "step",
        "step": number,
        "total_steps": 100,
        "epoch": number / 100,
        "loss": 3.0 - number / 100,
        "lr": 2e-4,
        "tokens_per_s": 1234.0,
        "tokens": number * 512.0,
        "gpu_mem_allocated_gb": 12.3,
        "gpu_mem_reserved_gb": 14.0,
        "gpu_util": 87,
        **extra,
    }


def dollars(text: str) -> float:
    match = re.match(r"\$([\d,]+\.\d\d)", text)
    assert match, text
    return float(match.group(1).replace(",", ""))


def chip_names(page: MonitorPage) -> list[str]:
    return [chip.text().split("\n")[0] for chip in page.timeline.chips]


def log_text(page: MonitorPage) -> str:
    return page.log_view.toPlainText()


def test_monitor_follows_events_appended_while_it_polls(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, FLOW, rate=36_000.0)  # $10 a second: the cost visibly grows
    path = events_of(context.store, run_id)
    page.show_run(run_id)
    wait_for(lambda: page.state_badge.text() == "Training")
    assert page.chart.empty_label.isVisibleTo(page) and page.chart.empty_label.text() == EMPTY_TEXT
    assert not page.chart.showing_points(), "no empty grid before the first loss"
    train_curve, eval_curve = page.chart.train_curve, page.chart.eval_curve
    writer = EventWriter(path)  # the payload's own writer: complete lines, fsynced
    writer.emit(EventKind.STATE, state="training", loss_on="assistant turns")
    now = time.time()
    append(path, *(step_event(2 + i, now - 8 + 2 * i, 10 * (i + 1)) for i in range(5)))
    wait_for(lambda: page.chart.point_counts() == (5, 0))
    assert page.chart.showing_points()
    assert page.stats["step"].text() == "50 of 100 · epoch 0.50"
    # 10 steps every 2 s: 50 steps left take 10 s, less the time since the last step.
    eta = re.fullmatch(r"about (\d+) s", page.stats["eta"].text())
    assert eta and 7 <= int(eta.group(1)) <= 10, page.stats["eta"].text()
    first_cost = dollars(page.machine["cost"].text())
    assert first_cost > 0

    half = json.dumps({"ts": time.time(), "seq": 7, "event": "eval", "step": 50, "eval_loss": 2.4}) + "\n"
    with path.open("a", encoding="utf-8") as handle:  # a line caught half-written is not read until complete
        handle.write(half[:20])
    page.on_tick()
    wait_for(lambda: page._offset == path.stat().st_size - 20)
    assert page.chart.point_counts() == (5, 0)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(half[20:])
    append(path, *(step_event(8 + i, time.time(), 60 + 10 * i) for i in range(3)))
    wait_for(lambda: page.chart.point_counts() == (8, 1))

    assert page.chart.train_curve is train_curve and page.chart.eval_curve is eval_curve, "curves updated in place"
    assert page._offset == path.stat().st_size, "the file is read by byte offset up to its end"
    assert page.stats["step"].text() == "80 of 100 · epoch 0.80"
    assert page.stats["loss"].text() == "2.2000 · eval 2.4000"
    assert page.stats["speed"].text() == "1,234 tokens/s"
    assert page.stats["gpu_memory"].text() == "11.5 GiB peak allocated · 13.0 GiB reserved"  # 12.3 and 14.0 decimal GB
    assert page.stats["gpu_util"].text() == "87 %"
    assert page.busy_bar.maximum() == 100 and page.busy_bar.value() == 80
    assert page.busy_bar.format() == "Training: step 80 of 100 (80 %)"
    wait_for(lambda: dollars(page.machine["cost"].text()) > first_cost + 1)
    snapshot = page.snapshot
    assert snapshot is not None
    spent = run_spend(context.store, run_id, now=snapshot.now).usd  # the one count the status bar and tray use
    assert page.machine["cost"].text() == money(spent)
    assert page.machine["rate"].text() == "$36,000.00/h, as you stated"
    assert page.machine["machine"].text().startswith("Your server me@127.0.0.1:")
    assert chip_names(page) == [
        "Waiting",
        "Connecting",
        "Uploading",
        "Setting up",
        "Training",
        "Saving",
        "Bringing home",
        "Finished",
    ]
    names = [chip.accessibleName() for chip in page.timeline.chips]
    assert names[4].endswith(", now") and all(name.endswith("to come") for name in names[5:])


def test_a_recorded_finished_run_is_shown_from_its_files(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    store = context.store
    run_id = make_run(store, [*FLOW, RunState.SYNCING, RunState.PULLING], rate=2.0)
    folder = store.folder(run_id)
    adapter = folder / "adapter"
    adapter.mkdir()
    store.update(run_id, adapter=str(adapter))
    store.transition(run_id, RunState.FINISHED, f"adapter at {adapter}")
    writer = EventWriter(events_of(store, run_id))
    for number in range(1, 21):
        writer.emit(EventKind.STEP, step=number, total_steps=20, epoch=number / 20, loss=2.0 / number, lr=1e-4)
        if number % 10 == 0:
            writer.emit(EventKind.EVAL, step=number, eval_loss=1.5 / number)
            writer.emit(
                EventKind.CHECKPOINT, step=number, path=f"checkpoints/checkpoint-{number}", bytes=2_500_000, sha256={}
            )
    seal(folder / "checkpoints" / "checkpoint-20", {"adapter_model.safetensors": b"w"}, 20)
    writer.emit(EventKind.DONE, adapter_path="adapter", files={}, metrics={}, wall_seconds=30.0, train_seconds=20.0)
    writer.emit(EventKind.STATE, state="done")

    page.show_run(run_id)
    qloop.run_until_complete(page.refresh())
    wait_for(lambda: page.state_badge.text() == "Finished")
    assert page.chart.point_counts() == (20, 2)
    assert page.stats["adapter"].text() == str(adapter)
    assert page.stats["checkpoints"].text() == "1 checkpoint was kept on this computer · newest at step 20"
    assert page.stats["eta"].text() == "—"
    assert page.banner.isVisibleTo(page) and page.banner.headline_label.text().startswith("Finished")
    assert "1 checkpoint was kept" in page.banner.details_label.text()
    assert page.busy_bar.format().startswith("Finished")
    assert not (page.stop_button.isEnabled() or page.pull_button.isEnabled() or page.resume_button.isEnabled())
    assert page.stop_button.isHidden() and page.resume_button.isHidden(), "a finished run offers nothing to resume"
    assert page.folder_button.isEnabled()
    assert page.timeline.chips[-1].text().startswith("Finished\nat ")
    log = log_text(page)
    for words in ("Run created", "Checkpoint at step 10 saved on the machine (2.5 MB)", "Training done in 20 s"):
        assert words in log
    assert f"Finished: the adapter is on this computer, in {adapter}" in log
    assert not any(raw in log for raw in RAW_WORDS), log


def test_the_recorded_tiny_run_reads_as_a_story_with_real_phase_durations(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = record_finished_run(context.store)
    page.show_run(run_id)
    wait_for(lambda: page.state_badge.text() == "Finished" and "Training done" in log_text(page))
    assert [chip.text() for chip in page.timeline.chips[:5]] == [
        "Waiting\n2 s",
        "Connecting\n6 s",
        "Uploading\n10 s",
        "Setting up\n3 min 00 s",
        "Training\n5 s",
    ]
    log = log_text(page)
    assert "Training on 64 examples" in log and "Eval loss 5.7316 at step 10" in log
    assert "Training done in 1 s: final loss 5.3160" in log
    assert not any(raw in log for raw in RAW_WORDS), log
    assert page.stats["checkpoints"].text() == "3 checkpoints were kept on this computer · newest at step 60"
    bar = page.log_view.verticalScrollBar()
    wait_for(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())  # the newest lines are in view


@pytest.mark.parametrize(
    ("states", "stop", "pull", "resume", "busy"),
    [
        ([], True, False, False, True),
        ([RunState.CONNECTING, RunState.UPLOADING], True, False, False, True),
        (FLOW, True, True, False, True),
        ([*FLOW, RunState.SYNCING], False, False, False, True),
        ([*FLOW, RunState.PAUSED], True, False, True, False),
        ([*FLOW, RunState.FAILED], False, False, True, False),
        ([*FLOW, RunState.CANCELLED], False, False, True, False),
    ],
)
def test_buttons_follow_the_run_state(
    page: MonitorPage,
    context: AppContext,
    wait_for: Callable[..., None],
    states: list[RunState],
    stop: bool,
    pull: bool,
    resume: bool,
    busy: bool,
) -> None:
    run_id = make_run(context.store, states)
    page.show_run(run_id)
    wait_for(lambda: page.record is not None and page.state_badge.text() != "Reading…")
    assert page.stop_button.isEnabled() is stop and page.stop_button.isHidden() is not stop
    assert page.pull_button.isEnabled() is pull
    assert page.resume_button.isEnabled() is resume and page.resume_button.isHidden() is not resume
    assert page.move_button.isEnabled() is resume, "an own server's run can also move to another server"
    assert page.folder_button.isEnabled()
    assert (page.busy_bar.maximum() == 0) is busy, page.busy_bar.format()


def test_trainer_errors_show_what_to_do_in_the_apps_words(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, FLOW)
    context.store.update(run_id, error="oom: CUDA out of memory — lower micro_batch")
    context.store.transition(run_id, RunState.FAILED, "oom")
    writer = EventWriter(events_of(context.store, run_id))
    hint = "out of GPU memory: reduce --seq-len or --micro-batch, use qlora, or rent a larger GPU"
    writer.emit(EventKind.ERROR, kind="oom", message="CUDA out of memory", hint=hint)
    writer.emit(EventKind.STATE, state="failed", reason="oom")
    page.show_run(run_id)
    wait_for(lambda: page.state_badge.text() == "Failed")
    assert page.banner.isVisibleTo(page) and page.banner.property("severity") == "danger"
    assert page.banner.headline_label.text() == "Out of GPU memory"
    details = page.banner.details_label.text()
    assert details.startswith("CUDA out of memory\nWhat to do: Lower the sequence length")
    assert "--" not in details and "--" not in log_text(page), "no command-line flags in the app"
    assert page.resume_button.isEnabled()


def test_the_log_holds_the_runs_history_and_this_windows_notes_of_it_only(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    from desktop.services.runs.events import EventLine

    shown, other = make_run(context.store, FLOW), make_run(context.store, FLOW)
    context.manager.engine(shown).report("said before the run was shown")
    page.show_run(shown)
    wait_for(lambda: page.record is not None and "Starting the trainer" in log_text(page))
    context.manager.engine(other).report("about another run")
    context.manager.engine(shown).report("trainer started (pid 42)")
    context.manager.engine(shown).report(EventLine("step 1: loss 2.0000"))  # the event itself is read from the file
    log = log_text(page)
    notes = [line.split("  ", 1)[1] for line in log.splitlines() if "  " in line]
    assert notes.index("said before the run was shown") < notes.index("trainer started (pid 42)")
    assert "said before the run was shown" in log and "about another run" not in log
    assert "step 1: loss" not in log
    for words in ("Run created", "Connecting to the machine", "Uploading the trainer and the data"):
        assert words in log
    page.show_run(other)
    assert "about another run" in log_text(page) and "trainer started" not in log_text(page)
    wait_for(lambda: page.record is not None and page.record.id == other)


def test_stop_asks_first_and_ends_a_run_that_had_not_started_training(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = make_run(context.store, [RunState.CONNECTING, RunState.UPLOADING])
    page.show_run(run_id)
    wait_for(page.stop_button.isEnabled)
    questions: list[tuple[str, str]] = []
    monkeypatch.setattr(monitor_page, "confirm", lambda _p, title, text, *_: questions.append((title, text)) or False)
    page.stop_button.click()
    assert questions == [
        ("Stop this run?", "Nothing has been trained yet: the run stops now. Resume starts it again later.")
    ]
    assert context.store.get(run_id).state is RunState.UPLOADING, "answering No changes nothing"
    monkeypatch.setattr(monitor_page, "confirm", lambda *_args: True)
    page.stop_button.click()
    wait_for(lambda: page.state_badge.text() == "Stopped")
    assert context.store.get(run_id).state is RunState.CANCELLED
    assert page.action_label.text() == "Stopped. The notice above says where Resume would continue."
    assert not page.stop_button.isEnabled()
    assert page.resume_button.isEnabled(), "what the Stop dialog promised: the run can be resumed"
    assert page.banner.headline_label.text() == "Stopped by you before training began"
    # the one wording of where a resume starts (the resume question and the Runs page say the same)
    said = "Resume continues from the beginning (no checkpoint is on this computer)."
    assert page.banner.details_label.text() == said
    wait_for(lambda: "Stopped by you before training began" in log_text(page))


def test_a_users_stop_is_logged_as_theirs_with_the_checkpoint_kept(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    store = context.store
    new_run, old_run = make_run(store, FLOW), make_run(store, FLOW)
    for run_id, field in ((new_run, {"checkpoint_step": 30}), (old_run, {})):  # an event file from before the field
        writer = EventWriter(events_of(store, run_id))
        writer.emit(EventKind.CHECKPOINT, step=30, path="checkpoints/checkpoint-30", bytes=1_000_000, sha256={})
        reason = "stopped by SIGTERM (checkpoint saved at step 30); start the job again to resume"
        writer.emit(EventKind.STATE, state="failed", reason=reason, stopped_by="signal", **field)
        store.update(run_id, spec={**store.get(run_id).spec, "stop_requested": True})
        store.transition(run_id, RunState.CANCELLED, reason)
    for run_id in (new_run, old_run):
        page.show_run(run_id)
        wait_for(lambda: "Stopped by you — checkpoint at step 30 kept" in log_text(page))
        assert page.banner.headline_label.text() == "Stopped by you — checkpoint at step 30 kept"
        assert page.banner.details_label.text() == "Resume continues from the checkpoint at step 30 on your server."
        said = "The trainer saved a checkpoint at step 30 and stopped" if run_id == new_run else "The trainer stopped"
        assert f"  {said}\n" in log_text(page) + "\n"
        assert not any(raw in log_text(page) for raw in RAW_WORDS), log_text(page)


def test_pull_from_an_unreachable_machine_says_so(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, FLOW)
    page.show_run(run_id)
    wait_for(page.pull_button.isEnabled)
    page.pull_button.click()
    wait_for(lambda: page.action_label.text().startswith("That did not work"))
    assert "Check the machine is reachable" in page.action_label.text()
    assert page.pull_button.isEnabled()
    assert context.store.get(run_id).state is RunState.TRAINING


def test_resume_reconnects_and_pauses_again_while_the_machine_is_unreachable(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, [*FLOW, RunState.PAUSED])
    page.show_run(run_id)
    wait_for(page.resume_button.isEnabled)
    page.resume_button.click()
    assert page.action_label.text().startswith("Resuming")
    wait_for(lambda: context.manager.is_driving(run_id) or len(context.store.transitions(run_id)) > 6)
    wait_for(lambda: not context.manager.is_driving(run_id))
    assert [t["to_state"] for t in context.store.transitions(run_id)][-2:] == ["connecting", "paused"]
    wait_for(lambda: page.state_badge.text() == "Paused" and page.resume_button.isEnabled())
    assert "Machine unreachable" in page.banner.details_label.text()


def test_a_stopped_run_resumes_through_the_same_button(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, [*FLOW, RunState.CANCELLED])
    page.show_run(run_id)
    wait_for(page.resume_button.isEnabled)
    page.resume_button.click()

    def history() -> list[str]:
        return [t["to_state"] for t in context.store.transitions(run_id)]

    wait_for(
        lambda: history()[-1] == "paused" and "connecting" in history()[-2:] and not context.manager.is_driving(run_id)
    )
    assert history()[-4:] == ["cancelled", "paused", "connecting", "paused"], "reopened, then driven (nothing answers)"
    wait_for(lambda: "Resumed by you: continuing from the newest checkpoint" in log_text(page))


def test_a_run_stopped_at_its_budget_says_why_it_cannot_resume(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, [*FLOW, RunState.CANCELLED])
    spec = context.store.get(run_id).spec
    context.store.update(run_id, spec={**spec, "budget_stop": "budget of $5.00 reached ($5.01 at $2.00/h)"})
    page.show_run(run_id)
    wait_for(lambda: page.state_badge.text() == "Stopped at budget")
    assert page.resume_button.isVisibleTo(page) and not page.resume_button.isEnabled()
    assert "stopped at its budget" in page.resume_button.toolTip()
    assert page.banner.headline_label.text().startswith("Stopped at its budget")


def test_resume_elsewhere_moves_the_run_to_the_server_entered(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = make_run(context.store, [*FLOW, RunState.PAUSED])
    other = SshTarget("trainer", "127.0.0.1", closed_port(), None, "python3")
    asked: list[SshTarget | None] = []
    monkeypatch.setattr(monitor_page, "ask_new_target", lambda _parent, current: asked.append(current) or other)
    page.show_run(run_id)
    wait_for(page.move_button.isEnabled)
    page.move_button.click()
    assert asked and asked[0] is not None and asked[0].user == "me", "the dialog starts from the present server"
    assert page.action_label.text().startswith(f"Moving to {other.url}")
    wait_for(lambda: context.store.get(run_id).target == other.url)
    wait_for(lambda: not context.manager.is_driving(run_id) and context.store.get(run_id).state is RunState.PAUSED)


def test_upload_shows_how_far_it_got(page: MonitorPage, context: AppContext, wait_for: Callable[..., None]) -> None:
    run_id = make_run(context.store, [RunState.CONNECTING, RunState.UPLOADING])
    meter = UploadMeter(context.store.folder(run_id) / UPLOAD_PROGRESS_NAME, [150_000_000, 50_000_000])
    meter.on_file("train.jsonl", 12_300_000, 150_000_000)
    meter._write(force=True)  # the meter writes about once a second; a test does not wait for it
    page.show_run(run_id)
    wait_for(lambda: "MB" in page.busy_bar.format())
    assert page.busy_bar.format() == "Uploading the trainer and the data: 12.3 of 200.0 MB (6 %)"
    assert (page.busy_bar.value(), page.busy_bar.maximum()) == (62, 1000)
    meter.file_done()
    meter.file_done()
    wait_for(lambda: page.busy_bar.format().endswith("200.0 of 200.0 MB (100 %)"))


def test_a_rented_run_shows_its_machines_rate_and_cost_against_the_estimate(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = record_live_rented_run(context.store, Ledger())
    page.show_run(run_id)
    wait_for(lambda: page.state_badge.text() == "Training" and page.chart.point_counts()[0] > 0)
    names = chip_names(page)
    # the machine let go is one chip with its time, its phases in the tooltip: the newest machine's phases follow
    assert names[:3] == ["Renting", "Machine 1", "Machine 2"] and names.count("Training") == 1
    lost = page.timeline.chips[1]
    assert lost.text().startswith("Machine 1\nRTX 4090 · RunPod · ")
    assert "spot machine outbid" in lost.toolTip() and "Paused" in lost.toolTip() and "Training" in lost.toolTip()
    machine = {key: label.text() for key, label in page.machine.items()}
    assert machine["machine"] == "Vast.ai · spot · machine 2 of this run"
    assert (machine["gpu"], machine["rate"]) == ("RTX 4090", "$0.41/h")
    snapshot = page.snapshot
    assert snapshot is not None and snapshot.spend is not None
    assert machine["cost"].startswith(f"{money(snapshot.spend.usd)} of about $0.07 expected (")
    assert machine["estimate"].startswith("$0.07 for about 12 min 36 s on RTX 4090")
    log = log_text(page)
    assert "Rented machine 1: RTX 4090 at RunPod for $0.34/h" in log
    assert "Machine 1 let go after costing $0.02: the RunPod machine rp-7f3a was stopped" in log
    assert "Training on 2,400 examples, continuing from checkpoint-20" in log
    assert page.chart.point_counts()[0] == 38, "the steps trained again after the resume replace the lost ones"
    assert not page.move_button.isVisibleTo(page), "a rented run resumes on a rented machine, never elsewhere"


def test_switching_runs_never_keeps_the_previous_runs_axes_or_curves(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    long_run = record_finished_run(context.store)
    fresh = make_run(context.store, FLOW)
    page.show_run(long_run)
    wait_for(lambda: page.chart.point_counts() == (60, 6))
    assert page.chart.axis_ranges()[0] == 60.0
    page.show_run(fresh)
    assert page.chart.point_counts() == (0, 0) and page.chart.axis_ranges() == (0.0, (0.0, 0.0))
    assert not page.chart.showing_points()
    assert all(label.text() == "—" for label in page.stats.values())
    append(events_of(context.store, fresh), step_event(1, time.time(), 3))
    wait_for(lambda: page.chart.point_counts() == (1, 0))
    assert page.chart.axis_ranges()[0] == 100.0, "the new run's own length"


def test_the_chart_is_drawn_in_the_apps_palette_and_follows_a_theme_switch(page: MonitorPage) -> None:
    chart = page.chart
    try:
        apply_theme(Theme.DARK)
        assert chart.plot_widget.backgroundBrush().color().name() == DARK.surface
        assert chart.train_curve.opts["pen"].color().name() == DARK.chart[0]
        apply_theme(Theme.LIGHT)
        assert chart.plot_widget.backgroundBrush().color().name() == LIGHT.surface
        assert chart.eval_curve.opts["pen"].color().name() == LIGHT.chart[2]
    finally:
        apply_theme(Theme.LIGHT)


class UrlCatcher(QObject):
    """Receives the URLs QDesktopServices is asked to open (instead of a file manager)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[QUrl] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url)


def test_open_folder_opens_the_run_folder(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, FLOW)
    page.show_run(run_id)
    wait_for(lambda: page.record is not None)
    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("file", catcher, "open")
    try:
        page.folder_button.click()
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert [Path(url.toLocalFile()) for url in catcher.urls] == [context.store.runs_dir / run_id]


def test_unknown_run_shows_the_empty_state(
    page: MonitorPage, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    assert page.views.currentWidget() is page.empty_state
    page.show_run("20990101-000000-dead")
    qloop.run_until_complete(page.refresh())
    assert page.views.currentWidget().accessibleName() == "Run 20990101-000000-dead is no longer recorded"


def test_event_chunks_stop_at_the_last_complete_line_and_skip_junk(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE_NAME
    assert read_event_chunk(path, 0).events == []
    state = b'{"ts": 1760000000, "seq": 1, "event": "state", "state": "training"}'
    no_loss = b'{"ts": 1760000000, "seq": 9, "event": "step", "step": 1}'  # not a valid event
    path.write_bytes(b"\n".join([state, b"not json", b"[1, 2]", no_loss, b'{"ts": 1760000000, "seq": 2, "ev']))
    chunk = read_event_chunk(path, 0)
    assert [e["seq"] for e in chunk.events] == [1]
    assert chunk.offset == path.read_bytes().index(b'{"ts": 1760000000, "seq": 2') and not chunk.more
    line = b'{"ts": 1760000000, "seq": %d, "event": "step", "step": %d, "loss": 1.5}\n'
    big = b"".join(line % (n, n) for n in range(3, 2000))
    path.write_bytes(big)
    first = read_event_chunk(path, 0, limit=4096)
    assert first.more and first.offset <= 4096
    rest = read_event_chunk(path, first.offset)
    assert [e["seq"] for e in first.events + rest.events] == list(range(3, 2000))
    replaced = read_event_chunk(path, path.stat().st_size + 100)
    assert replaced.restarted and replaced.events[0]["seq"] == 3


def test_a_run_stopped_from_the_monitor_resumes_from_its_checkpoint_and_finishes(
    page: MonitorPage,
    context: AppContext,
    wait_for: Callable[..., None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the Stop dialog promises: stop keeps a checkpoint, Resume continues on the same machine; the run is
    followed to its adapter. The machine is in memory: the same stop and resume on a real sshd and trainer are
    test_engine_end_to_end's stop test and test_rented_resume; the wizard journey follows a real run in the app."""
    from desktop.services.renting.manager import RunManager
    from desktop.services.runs.events import mirrored_events
    from tests.runs.test_run_manager import checkpoint, spec

    host = FakeHost()
    host.on_launch = lambda fake, folder: [checkpoint(fake, folder, step) for step in (4, 5)]
    host.on_terminate = lambda fake, folder: checkpoint(fake, folder, 6)  # the trainer saves when told to stop
    context._manager = RunManager(context.store, context.secrets, context._options(), connect=host.connect)
    record = context.manager.launch(spec(tmp_path))
    page.show_run(record.id)
    checkpoints = context.store.runs_dir / record.id / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("checkpoint-*/rentune_checkpoint.json")), 60)
    monkeypatch.setattr(monitor_page, "confirm", lambda *_args: True)
    wait_for(page.stop_button.isEnabled)
    page.stop_button.click()
    wait_for(lambda: page.state_badge.text() == "Stopped" and page.resume_button.isEnabled(), timeout=60)
    stopped = page.progress.stopped
    assert stopped is not None and stopped.checkpoint_step == 6
    headline = "Stopped by you — checkpoint at step 6 kept"
    assert page.banner.headline_label.text() == headline
    wait_for(lambda: headline in log_text(page))

    def resumed_trainer(fake: FakeHost, folder: str) -> None:
        for step in (7, 8):
            fake.emit(EventKind.STEP, step=step, loss=1.0 / step)
        files = fake.write_folder(f"{folder}/out/adapter", {"adapter_model.safetensors": b"final weights"})
        fake.emit(EventKind.DONE, adapter_path="adapter", files=files)

    host.on_launch = resumed_trainer
    page.resume_button.click()
    # Resume reopens the run as paused, then the manager takes it up: paused alone is not "driven yet" (under load
    # the test saw the paused run before the manager started and took it for the end).
    wait_for(
        lambda: (
            context.manager.is_driving(record.id)
            or context.store.get(record.id).state not in {RunState.CANCELLED, RunState.PAUSED}
        )
    )
    wait_for(
        lambda: not context.manager.is_driving(record.id) and context.store.get(record.id).state not in LIVE,
        timeout=60,
    )
    final = context.store.get(record.id)
    assert final.state is RunState.FINISHED, final.error
    assert host.launches == 2, "resumed on the same machine"
    steps = [e["step"] for e in mirrored_events(context.store.runs_dir / record.id) if e["event"] is EventKind.STEP]
    assert steps == [4, 5, 6, 7, 8]
    wait_for(lambda: page.state_badge.text() == "Finished")
    log = log_text(page)
    assert "Resumed by you: continuing from the newest checkpoint" in log
    # followed to its adapter: the chart, the numbers, the log in words, nothing left to press
    assert page.chart.point_counts()[0] >= 2
    assert page.stats["adapter"].text() == final.adapter
    assert "Machine ready" in log and "Bringing the adapter home" in log
    assert f"Finished: the adapter is on this computer, in {final.adapter}" in log
    assert not any(raw in log for raw in RAW_WORDS), log
    assert not (page.stop_button.isEnabled() or page.pull_button.isEnabled() or page.resume_button.isEnabled())
    chips = chip_names(page)
    assert chips[-1] == "Finished" and "Training" in chips


def test_the_chart_axes_change_only_when_the_points_leave_them() -> None:
    """Re-ranging rebuilds both axes: the step axis spans the run, the loss axis moves only when a loss leaves it."""
    assert step_axis_end(40, 500, 0.0) == 500.0  # the run's length is known: the axis spans it from the start
    assert step_axis_end(40, 0, 0.0) == 64.0  # unknown: room to grow, in steps that double
    assert step_axis_end(60, 0, 64.0) == 64.0
    assert step_axis_end(70, 0, 64.0) == 128.0
    assert step_axis_end(600, 500, 500.0) == 1024.0  # resumed past its planned end: grows again
    first = loss_axis_range(5.9, 6.3, (0.0, 0.0))
    assert first == pytest.approx((5.7, 6.34))  # fitted, with room below for the loss to fall into
    assert loss_axis_range(5.75, 6.3, first) == first  # still inside: unchanged
    assert loss_axis_range(5.6, 6.3, first) == pytest.approx((5.25, 6.37))  # fell out below: re-fitted
    assert loss_axis_range(0.2, 0.4, (0.0, 6.0)) == pytest.approx((0.1, 0.42))  # huddled in a corner: zoom in
    assert loss_axis_range(0.5, 0.5, (0.0, 0.0)) == pytest.approx((0.475, 0.505))  # one point
    assert loss_axis_range(float("nan"), 2.0, (1.0, 3.0)) == (1.0, 3.0)


def test_an_action_that_ends_after_its_window_closed_shows_nothing_and_raises_nothing(
    context: AppContext, qloop: asyncio.AbstractEventLoop
) -> None:
    """A resume or pull still running when the window is closed ends quietly (it set a label of the closed page)."""
    from desktop.services.runs.engine import RunError

    widget = MonitorPage(context)
    run_id = make_run(RunStore(), [RunState.PAUSED])
    widget.run_id = run_id
    answer: asyncio.Future[str] = qloop.create_future()
    acting = asyncio.ensure_future(widget._act(run_id, "Resuming…", answer), loop=qloop)
    qloop.run_until_complete(asyncio.sleep(0))
    widget.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert not shiboken6.isValid(widget)
    answer.set_exception(RunError("the machine did not answer"))
    assert qloop.run_until_complete(acting) == (False, None)


def test_a_run_on_several_machines_shows_each_machine_and_where_it_stands(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = context.store
    head = make_run(store, [*FLOW[:-1], RunState.PAUSED], target="ssh://me@10.0.0.1:22")
    for rank, (host, state) in enumerate((("10.0.0.2", RunState.PAUSED), ("10.0.0.3", RunState.PLANNED)), start=1):
        node = store.create({"training": {}}, f"ssh://me@{host}:2222", node_of=head, rank=rank).id
        if state is RunState.PAUSED:
            store.transition(node, RunState.CONNECTING)
            store.transition(node, state)
    page.show_run(head)
    wait_for(lambda: not page.view.nodes_card.isHidden())
    assert page.view.nodes_label.text().splitlines() == [
        "Head (rank 0) · me@10.0.0.1 · stopped with the run (paused)",
        "Rank 1 · me@10.0.0.2:2222 · stopped with the run (paused)",
        "Rank 2 · me@10.0.0.3:2222 · waiting for its machine",
    ]
    assert page.resume_button.isEnabled() and page.move_button.isEnabled(), "or onto a fresh set of servers"
    fresh = tuple(SshTarget("me", "127.0.0.1", closed_port(), None, "python3") for _ in range(3))
    asked: list[list[SshTarget]] = []
    monkeypatch.setattr(monitor_page, "ask_new_targets", lambda _parent, current: asked.append(current) or fresh)
    page.move_button.click()
    assert [t.host for t in asked[0]] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "the dialog starts from these"
    assert page.action_label.text().startswith("Moving to 3 servers")
    wait_for(lambda: [r.target for r in (store.get(head), *store.nodes_of(head))] == [t.url for t in fresh])
    assert {cluster_of(r)["head_address"] for r in (store.get(head), *store.nodes_of(head))} == {"127.0.0.1"}
    wait_for(lambda: not context.manager.is_driving(head) and store.get(head).state is RunState.PAUSED)
    single = make_run(store, [*FLOW[:-1], RunState.PAUSED])
    page.show_run(single)
    wait_for(lambda: page.record is not None and page.record.id == single)
    assert page.view.nodes_card.isHidden()


def test_a_serving_run_says_where_programs_reach_it_what_it_answered_and_that_it_bills_until_stopped(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    flow = [*FLOW, RunState.SYNCING, RunState.PULLING, RunState.SERVING]
    run_id = make_run(context.store, flow, rate=2.0)
    store = context.store
    serve = {"name": "pattern", "idle_minutes": 30.0, "local_port": 0, "context": 256, "backend": "auto"}
    store.update(run_id, pid=4242, spec={**store.get(run_id).spec, "serve": serve})
    page.show_run(run_id)
    qloop.run_until_complete(page.refresh())
    wait_for(lambda: page.state_badge.text() == "Serving")
    assert page.banner.headline_label.text() == "Starting the server on the machine"
    assert not page.copy_address_button.isVisible(), "no address yet"
    serving = {"url": "http://127.0.0.1:8123/v1", "model": "pattern", "backend": "llama.cpp", "requests": 1}
    store.update(run_id, spec={**store.get(run_id).spec, "serving": serving})
    qloop.run_until_complete(page.refresh())
    wait_for(lambda: page.banner.headline_label.text() == "Serving pattern at http://127.0.0.1:8123/v1")
    details = page.banner.details_label.text()
    assert "1 request answered so far" in details and "bills while it serves: it stops after 30 min" in details
    assert page.stop_button.isVisible() and page.stop_button.isEnabled(), "Stop ends serving"
    assert page.copy_address_button.isVisible()
    page.copy_address_button.click()
    assert QApplication.clipboard().text() == "http://127.0.0.1:8123/v1"
    assert page.models_button.isHidden() or page.models_button.isEnabled()
    assert monitor_page.monitor_text.stop_question(page.snapshot)[0] == "Stop serving?"  # type: ignore[arg-type]


def test_a_dpo_run_shows_how_often_the_chosen_answer_wins_and_an_sft_run_shows_no_such_row(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    sft = make_run(context.store, FLOW)
    append(events_of(context.store, sft), *(step_event(1 + i, time.time(), 10 * (i + 1)) for i in range(3)))
    page.show_run(sft)
    wait_for(lambda: page.chart.point_counts() == (3, 0))
    view = page.view
    assert not view.preference_chart.isVisibleTo(page) and not page.stats["preference"].isVisibleTo(page)
    assert view.chart_card.title_label is not None and view.chart_card.title_label.text() == "Loss"

    dpo = make_run(context.store, FLOW)
    path = events_of(context.store, dpo)
    now = time.time()
    rewards = [
        {"reward_accuracy": share, "reward_margin": margin, "reward_chosen": margin / 2, "reward_rejected": -margin / 2}
        for share, margin in [(0.5, 0.0), (0.75, 0.12), (1.0, 0.44)]
    ]
    append(path, *(step_event(1 + i, now, 10 * (i + 1), **rewards[i]) for i in range(3)))
    append(
        path,
        {
            "ts": now,
            "seq": 4,
            "event": "eval",
            "step": 30,
            "eval_loss": 0.5,
            "reward_accuracy": 0.875,
            "reward_margin": 0.31,
        },
    )
    page.show_run(dpo)
    wait_for(lambda: view.preference_chart.point_counts() == (3, 1))
    assert view.preference_chart.isVisibleTo(page) and view.chart_card.title_label.text() == "Loss and preference"
    _, shares = view.preference_chart.train_curve.getData()
    assert list(shares) == [50.0, 75.0, 100.0]
    assert page.stats["preference"].isVisibleTo(page)
    assert page.stats["preference"].text() == (
        "100 %, margin +0.44 (chosen +0.22, rejected -0.22) · held-out 88 %, margin +0.31"
    )
    # A resumed session retrains from step 20: the points from there on are replaced, not doubled.
    append(path, step_event(5, now, 20, reward_accuracy=0.625, reward_margin=0.05))
    wait_for(lambda: view.preference_chart.point_counts() == (2, 1))  # its eval is replaced when it comes again
    page.show_run(sft)
    wait_for(lambda: not view.preference_chart.isVisibleTo(page))
    assert not page.stats["preference"].isVisibleTo(page)


def test_continued_pretraining_shows_the_held_out_perplexity_before_training_and_after(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    import math

    spec = {"base_model": "tiny-llama", "training": {"method": "lora", "objective": "cpt"}, "hourly_rate_usd": 0.0}
    run_id = context.store.create(spec, f"ssh://me@127.0.0.1:{closed_port()}").id
    for state in FLOW:
        context.store.transition(run_id, state)
    path = events_of(context.store, run_id)
    now = time.time()
    append(path, {"ts": now, "seq": 1, "event": "eval", "step": 0, "eval_loss": math.log(400.0)})
    append(
        path, step_event(2, now, 10), {"ts": now, "seq": 3, "event": "eval", "step": 10, "eval_loss": math.log(300.0)}
    )
    page.show_run(run_id)
    wait_for(lambda: page.chart.point_counts() == (1, 2))
    assert page.stats["perplexity"].text() == "400.0 before training · 300.0 at step 10 (-25 %)"
    assert page.stats["perplexity"].isVisibleTo(page) and not page.stats["preference"].isVisibleTo(page)
    append(path, {"ts": now, "seq": 4, "event": "done", "adapter_path": "adapter", "files": {}, "wall_seconds": 9.0,
                  "train_seconds": 8.0, "metrics": {"base_perplexity": 400.0, "perplexity": 280.0}})  # fmt: skip
    wait_for(lambda: page.stats["perplexity"].text() == "400.0 before training · 280.0 after (-30 %)")


def test_tensorboard_shows_a_runs_event_files_in_a_local_tensorboard_opened_in_the_browser(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    import httpx
    from tensorboardX import SummaryWriter

    run_id = make_run(context.store, FLOW)
    page.show_run(run_id)
    wait_for(lambda: page.record is not None)
    assert not page.tensorboard_button.isVisibleTo(page), "no event files at home: no button"
    checkpoint = context.store.folder(run_id) / "checkpoints" / "checkpoint-10"
    with SummaryWriter(str(checkpoint / "tensorboard")) as writer:  # what the machine wrote, as it came home
        for step in range(1, 11):
            writer.add_scalar("train/loss", 3.0 - step / 10, step)
    (checkpoint / CHECKPOINT_MARKER).write_text("{}")
    wait_for(lambda: page.tensorboard_button.isVisibleTo(page), 20)
    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("http", catcher, "open")
    try:
        page.tensorboard_button.click()
        wait_for(lambda: bool(catcher.urls), 60)
        page.tensorboard_button.click()  # a second click opens the same TensorBoard again
        wait_for(lambda: len(catcher.urls) == 2, 10)
    finally:
        QDesktopServices.unsetUrlHandler("http")
    (board,) = page._boards.values()
    try:
        assert catcher.urls[0].toString() == catcher.urls[1].toString() == board.url
        assert page.action_label.text().startswith(f"TensorBoard is at {board.url}")
        tags = httpx.get(f"{board.url}data/plugin/scalars/tags", timeout=10).json()
        assert [list(run) for run in tags.values()] == [["train/loss"]]
    finally:
        qloop.run_until_complete(board.stop())


def test_trackio_shows_a_runs_database_in_trackios_dashboard_opened_in_the_browser_without_touching_the_seal(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    import httpx

    run_id = make_run(context.store, FLOW)
    page.show_run(run_id)
    wait_for(lambda: page.record is not None)
    assert not page.trackio_button.isVisibleTo(page), "no trackio database at home: no button"
    checkpoint = context.store.folder(run_id) / "checkpoints" / "checkpoint-10"
    database = write_trackio_database(checkpoint / "trackio", [3.0 - step / 10 for step in range(1, 11)], run=run_id)
    sealed = database.read_bytes()
    (checkpoint / CHECKPOINT_MARKER).write_text("{}")
    wait_for(lambda: page.trackio_button.isVisibleTo(page), 20)
    assert not page.tensorboard_button.isVisibleTo(page)
    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("http", catcher, "open")
    try:
        page.trackio_button.click()
        wait_for(lambda: bool(catcher.urls), 60)
    finally:
        QDesktopServices.unsetUrlHandler("http")
    (board,) = page._boards.values()
    try:
        assert catcher.urls[0].toString() == board.url
        assert page.action_label.text().startswith(f"trackio is at {board.url}")
        asked = {"project": "rentune", "run": run_id, "scalar_only": True}
        rows = httpx.post(f"{board.url}api/get_logs", json=asked, timeout=10).json()["data"]
        assert [row["train/loss"] for row in rows] == pytest.approx([3.0 - step / 10 for step in range(1, 11)])
    finally:
        qloop.run_until_complete(board.stop())
    assert database.read_bytes() == sealed, "the dashboard was shown a copy: the sealed file is as it came home"
    assert board.scratch is not None and not board.scratch.exists(), "its copy went with it"


def test_a_run_with_a_bucket_says_where_its_data_and_checkpoints_are_and_one_without_shows_no_bucket_row(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    plain = make_run(context.store, FLOW)
    page.show_run(plain)
    wait_for(lambda: page.record is not None and page.record.id == plain)
    assert not page.view.machine["bucket"].isVisibleTo(page)
    spec = {"base_model": "tiny", "training": {"method": "full"}, "hourly_rate_usd": 0.0,
            "bucket": {"url": "s3://team-bucket/rentune", "endpoint": "", "region": "us-east-1"}}  # fmt: skip
    with_bucket = context.store.create(spec, f"ssh://me@127.0.0.1:{closed_port()}").id
    page.show_run(with_bucket)
    wait_for(lambda: page.view.machine["bucket"].isVisibleTo(page))
    assert page.view.machine["bucket"].text() == (
        "s3://team-bucket/rentune: the machine reads the data there; checkpoints go there and stay there"
    )


def test_a_runs_title_names_its_objective_beside_its_method() -> None:
    from desktop.ui.run_words import training_words

    assert training_words({"training": {"method": "lora", "objective": "dpo"}}) == "LoRA · DPO"
    assert (
        training_words({"training": {"method": "full", "objective": "cpt"}})
        == "Full fine-tune · continued pre-training"
    )
    assert training_words({"training": {"method": "qlora"}}) == training_words({}) == "QLoRA", "chats: the method alone"
