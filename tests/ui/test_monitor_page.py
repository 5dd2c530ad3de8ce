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
from PySide6.QtCore import QObject, QUrl, Slot
from PySide6.QtGui import QDesktopServices
from pytestqt.qtbot import QtBot

from desktop.core.runs.spec import SshTarget
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.engine import EngineOptions
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.pages import monitor_page
from desktop.ui.pages.monitor_page import MonitorPage, read_event_chunk
from desktop.ui.widgets.loss_chart import loss_axis_range, step_axis_end
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory, make_spec  # noqa: F401 - the fixture, shared with the engine tests
from trainer_payload.protocol import EVENTS_FILE_NAME, EventKind, EventWriter

FLOW = [RunState.CONNECTING, RunState.UPLOADING, RunState.BOOTSTRAPPING, RunState.TRAINING]


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
    match = re.match(r"\$([\d,]+\.\d\d) at \$", text)
    assert match, text
    return float(match.group(1).replace(",", ""))


def test_monitor_follows_events_appended_while_it_polls(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    run_id = make_run(context.store, FLOW, rate=36_000.0)  # $10 a second: the cost visibly grows
    path = events_of(context.store, run_id)
    page.show_run(run_id)
    wait_for(lambda: page.state_label.text().startswith("Training"))
    train_curve, eval_curve = page.chart.train_curve, page.chart.eval_curve
    writer = EventWriter(path)  # the payload's own writer: complete lines, fsynced
    writer.emit(EventKind.STATE, state="training", loss_on="assistant turns")
    now = time.time()
    append(path, *(step_event(2 + i, now - 8 + 2 * i, 10 * (i + 1)) for i in range(5)))
    wait_for(lambda: page.chart.point_counts() == (5, 0))
    assert page.stats["step"].text() == "50 of 100 · epoch 0.50"
    # 10 steps every 2 s: 50 steps left take 10 s, less the time since the last step.
    eta = re.fullmatch(r"about (\d+) s", page.stats["eta"].text())
    assert eta and 7 <= int(eta.group(1)) <= 10, page.stats["eta"].text()
    first_cost = dollars(page.stats["cost"].text())
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
    assert page.stats["gpu_memory"].text() == "12.3 GB peak allocated · 14.0 GB reserved"
    assert page.stats["gpu_util"].text() == "87 %"
    assert page.busy_bar.maximum() == 100 and page.busy_bar.value() == 80
    wait_for(lambda: dollars(page.stats["cost"].text()) > first_cost + 1)
    assert [chip.text().split("\n")[0] for chip in page.timeline.chips] == [
        "Planned",
        "Connecting",
        "Uploading",
        "Bootstrapping",
        "Training",
    ]
    assert page.timeline.chips[-1].accessibleName().endswith(", now")


def test_a_recorded_finished_run_is_shown_from_its_files(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    store = context.store
    run_id = make_run(store, [*FLOW, RunState.SYNCING, RunState.PULLING], rate=2.0)
    adapter = store.folder(run_id) / "adapter"
    adapter.mkdir()
    store.update(run_id, adapter=str(adapter))
    store.transition(run_id, RunState.FINISHED, f"adapter at {adapter}")
    writer = EventWriter(events_of(store, run_id))
    for number in range(1, 21):
        writer.emit(EventKind.STEP, step=number, total_steps=20, epoch=number / 20, loss=2.0 / number, lr=1e-4)
        if number % 10 == 0:
            writer.emit(EventKind.EVAL, step=number, eval_loss=1.5 / number)
            folder = f"checkpoints/checkpoint-{number}"
            writer.emit(EventKind.CHECKPOINT, step=number, path=folder, bytes=2_500_000, sha256={})
    writer.emit(EventKind.DONE, adapter_path="adapter", files={}, metrics={}, wall_seconds=30.0, train_seconds=20.0)
    writer.emit(EventKind.STATE, state="done")

    page.show_run(run_id)
    qloop.run_until_complete(page.refresh())
    wait_for(lambda: page.state_label.text() == "Finished")
    assert page.chart.point_counts() == (20, 2)
    assert page.stats["adapter"].text() == str(adapter)
    assert page.stats["checkpoints"].text() == "2 saved · newest at step 20 (2.5 MB)"
    assert page.stats["eta"].text() == "—"
    assert page.stats["cost"].text().endswith("at $2.00/h")
    assert page.busy_bar.format().startswith("Finished")
    assert [page.stop_button.isEnabled(), page.pull_button.isEnabled(), page.resume_button.isEnabled()] == [
        False,
        False,
        False,
    ]
    assert page.folder_button.isEnabled()
    assert page.timeline.chips[-1].text() == "Finished\n—"
    assert page.problems_label.isHidden()


@pytest.mark.parametrize(
    ("states", "stop", "pull", "resume", "busy"),
    [
        ([], True, False, False, True),
        ([RunState.CONNECTING, RunState.UPLOADING], True, False, False, True),
        (FLOW, True, True, False, False),
        ([*FLOW, RunState.SYNCING], False, False, False, True),
        ([*FLOW, RunState.PAUSED], True, False, True, False),
        ([*FLOW, RunState.FAILED], False, False, True, False),
        ([*FLOW, RunState.CANCELLED], False, False, False, False),
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
    expected = (states[-1] if states else RunState.PLANNED).value.capitalize()
    wait_for(lambda: page.state_label.text() == expected)
    assert page.stop_button.isEnabled() is stop
    assert page.pull_button.isEnabled() is pull
    assert page.resume_button.isEnabled() is resume
    assert page.folder_button.isEnabled()
    assert (page.busy_bar.maximum() == 0) is busy, page.busy_bar.format()


def test_trainer_errors_show_their_hint(page: MonitorPage, context: AppContext, wait_for: Callable[..., None]) -> None:
    run_id = make_run(context.store, FLOW)
    context.store.update(run_id, error="oom: CUDA out of memory — lower micro_batch")
    context.store.transition(run_id, RunState.FAILED, "oom")
    writer = EventWriter(events_of(context.store, run_id))
    writer.emit(EventKind.ERROR, kind="oom", message="CUDA out of memory", hint="lower micro_batch or seq_len")
    writer.emit(EventKind.STATE, state="failed", reason="oom")
    page.show_run(run_id)
    wait_for(lambda: page.state_label.text() == "Failed")
    text = page.problems_label.text()
    assert "<b>oom</b>: CUDA out of memory" in text
    assert "What to do: lower micro_batch or seq_len" in text
    assert text.count("CUDA out of memory") == 1, "the run's error repeating the event is not shown twice"
    assert page.problems_label.isVisibleTo(page)
    assert page.resume_button.isEnabled()


def test_log_shows_the_lines_of_the_shown_run_only(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    shown, other = make_run(context.store, FLOW), make_run(context.store, FLOW)
    context.manager.engine(shown).report("said before the run was shown")
    page.show_run(shown)
    wait_for(lambda: page.record is not None)
    context.manager.engine(other).report("about another run")
    context.manager.engine(shown).report("trainer started (pid 42)")
    log = page.log_view.toPlainText()
    assert log.splitlines() == ["said before the run was shown", "trainer started (pid 42)"]
    page.show_run(other)
    assert page.log_view.toPlainText() == "about another run"
    wait_for(lambda: page.record is not None and page.record.id == other)


def test_stop_asks_first_and_ends_a_run_that_had_not_started_training(
    page: MonitorPage, context: AppContext, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = make_run(context.store, [RunState.CONNECTING, RunState.UPLOADING])
    page.show_run(run_id)
    wait_for(page.stop_button.isEnabled)
    questions: list[str] = []
    monkeypatch.setattr(monitor_page, "confirm", lambda _p, title, _q: questions.append(title) or False)
    page.stop_button.click()
    assert questions == ["Stop this run?"]
    assert context.store.get(run_id).state is RunState.UPLOADING, "answering No changes nothing"
    monkeypatch.setattr(monitor_page, "confirm", lambda *_args: True)
    page.stop_button.click()
    wait_for(lambda: page.state_label.text() == "Cancelled")
    assert context.store.get(run_id).state is RunState.CANCELLED
    assert page.action_label.text() == "Run cancelled."
    assert not page.stop_button.isEnabled()


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
    wait_for(lambda: not context.manager.is_driving(run_id))
    assert [t["to_state"] for t in context.store.transitions(run_id)][-2:] == ["connecting", "paused"]
    wait_for(lambda: page.state_label.text() == "Paused" and page.resume_button.isEnabled())
    assert "machine unreachable" in page.problems_label.text()


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
    assert context.store.get(run_id).target == other.url
    assert page.action_label.text().startswith(f"Moving to {other.url}")
    wait_for(lambda: not context.manager.is_driving(run_id))  # nothing listens there: it pauses again
    assert context.store.get(run_id).state is RunState.PAUSED


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
    assert page.views.currentIndex() == 0
    page.show_run("20990101-000000-dead")
    qloop.run_until_complete(page.refresh())
    assert page.views.currentIndex() == 0
    assert "no longer recorded" in page.empty_label.text()


def test_event_chunks_stop_at_the_last_complete_line_and_skip_junk(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE_NAME
    assert read_event_chunk(path, 0).events == []
    state = b'{"ts": 1, "seq": 1, "event": "state", "state": "training"}'
    no_loss = b'{"ts": 1, "seq": 9, "event": "step", "step": 1}'  # not a valid event
    path.write_bytes(b"\n".join([state, b"not json", b"[1, 2]", no_loss, b'{"ts": 1, "seq": 2, "ev']))
    chunk = read_event_chunk(path, 0)
    assert [e["seq"] for e in chunk.events] == [1]
    assert chunk.offset == path.read_bytes().index(b'{"ts": 1, "seq": 2') and not chunk.more
    big = b"".join(b'{"ts": 1, "seq": %d, "event": "step", "step": %d, "loss": 1.5}\n' % (n, n) for n in range(3, 2000))
    path.write_bytes(big)
    first = read_event_chunk(path, 0, limit=4096)
    assert first.more and first.offset <= 4096
    rest = read_event_chunk(path, first.offset)
    assert [e["seq"] for e in first.events + rest.events] == list(range(3, 2000))
    replaced = read_event_chunk(path, path.stat().st_size + 100)
    assert replaced.restarted and replaced.events[0]["seq"] == 3


@pytest.mark.slow
def test_a_real_run_on_the_loopback_machine_is_followed_to_its_adapter(
    page: MonitorPage,
    context: AppContext,
    wait_for: Callable[..., None],
    ssh_host: SshHost,
    request: pytest.FixtureRequest,
) -> None:
    import tomllib

    from desktop.core.runs.spec import run_spec_from_dict

    write_spec: SpecFactory = request.getfixturevalue("make_spec")
    spec_path = write_spec(ssh_host, max_steps=20, checkpoint_steps=10)
    spec = run_spec_from_dict(tomllib.loads(spec_path.read_text()), spec_path.parent, spec_path)
    record = context.manager.launch(spec)
    page.show_run(record.id)
    wait_for(lambda: not context.manager.is_driving(record.id), timeout=240)
    wait_for(lambda: page.state_label.text() == "Finished")
    final = context.store.get(record.id)
    assert page.chart.point_counts()[0] >= 2
    assert page.stats["step"].text().startswith("20 of 20")
    assert page.stats["adapter"].text() == final.adapter
    assert page.stats["checkpoints"].text().startswith("2 saved")
    assert "adapter verified and saved" in page.log_view.toPlainText()
    assert not (page.stop_button.isEnabled() or page.pull_button.isEnabled() or page.resume_button.isEnabled())
    chips = [chip.text().split("\n")[0] for chip in page.timeline.chips]
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
