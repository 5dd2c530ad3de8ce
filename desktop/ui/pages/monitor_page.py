"""The live run monitor: phases, loss curves, throughput, GPU, ETA, cost, the log, and Stop / Pull / Resume.

The page tails the run's mirrored ``events.jsonl`` by byte offset every half second (reading only what is new,
off the UI thread) and re-reads the run's record, so it shows a run driven by this window, by a detached
``rentune`` process, or a run that ended long ago, all from the run's files.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncssh
from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import QDesktopServices, QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)
from qasync import asyncSlot

from desktop.core.runs.progress import RunProgress, cost_so_far, format_duration, phase_durations
from desktop.core.runs.spec import SshTarget, parse_ssh_url
from desktop.core.runs.states import RunState, flow_through
from desktop.services.machines.ssh import RemoteError
from desktop.services.runs.engine import RunError
from desktop.services.runs.store import RunRecord, UnknownRunError
from desktop.ui.background import CoroutineOperation, cancel_group, off_ui_thread
from desktop.ui.context import AppContext
from desktop.ui.pages.base import BasePage
from desktop.ui.widgets.dialogs import ask_new_target, confirm
from desktop.ui.widgets.loss_chart import LossChart
from desktop.ui.widgets.phase_timeline import PhaseTimeline
from trainer_payload.protocol import EVENTS_FILE_NAME, EventTail, read_event_file

T = TypeVar("T")

POLL_MS = 500
#: Bytes of events read per read; a long backlog is read in several, the UI updating between them.
CHUNK_BYTES = 1 << 20
#: New bytes read on the UI thread; more (a backlog) is read in a worker thread. 20 events/s are ~3 KB a poll.
INLINE_BYTES = 64 << 10
LOG_LINES = 500
#: The operation group of the page's reading of the shown run.
_READING = "reading"
#: Errors an action on a run can meet: the machine unreachable, a refused login, a failed command.
ACTION_ERRORS = (RunError, RemoteError, OSError, asyncssh.Error, asyncio.TimeoutError)

#: Before the trainer's final work (syncing, pulling) a run can be stopped; a paused one too: its machine may answer.
STOPPABLE = flow_through(RunState.TRAINING) | {RunState.PAUSED}
PULLABLE = frozenset({RunState.TRAINING})
RESUMABLE = frozenset({RunState.PAUSED, RunState.FAILED})
BUSY_TEXT = {
    RunState.PLANNED: "Waiting to start…",
    RunState.PROVISIONING: "Renting the machine…",
    RunState.CONNECTING: "Connecting to the machine…",
    RunState.UPLOADING: "Uploading the trainer and the data…",
    RunState.BOOTSTRAPPING: "Installing the trainer's packages on the machine…",
    RunState.SYNCING: "Bringing the newest checkpoint home…",
    RunState.PULLING: "Bringing the adapter home and verifying it…",
}
JOB_TEXT = {
    "installing": "The trainer is installing its packages…",
    "downloading": "The trainer is downloading the model…",
    "preparing": "The trainer is loading the model and the data…",
    "saving": "The trainer is saving the adapter…",
}
_STAT_ROWS = (
    ("step", "Step"),
    ("eta", "Time left"),
    ("loss", "Loss"),
    ("speed", "Throughput"),
    ("gpu_memory", "GPU memory"),
    ("gpu_util", "GPU use"),
    ("lr", "Learning rate"),
    ("cost", "Cost so far"),
    ("checkpoints", "Checkpoints"),
    ("adapter", "Adapter"),
)


def read_event_chunk(path: Path, offset: int, limit: int = CHUNK_BYTES) -> EventTail:
    """Reads the valid events of the complete lines after ``offset`` (at most ``limit`` bytes); blocking: a thread's.

    A file shorter than ``offset`` was replaced: it is read again from the start (``restarted``). Torn, malformed and
    over-long lines are skipped (see :func:`trainer_payload.protocol.read_event_file`).
    """
    return read_event_file(path, offset, limit)


class MonitorPage(BasePage):
    """Follows one run: what it is doing, how training goes, what it costs, and what can be done with it.

    Call :meth:`show_run` with a run id; the page then keeps itself current while it is visible.
    """

    page_name = "monitor"
    title = "Run monitor"
    icon_name = "activity"
    scrolls = False
    purpose = "Progress streams here from the machine; checkpoints come home while it trains."

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        self.context = context
        self.run_id: str | None = None
        self.record: RunRecord | None = None
        self.transitions: list[dict[str, Any]] = []
        self.progress = RunProgress()
        self._offset = 0
        self._refreshing = False
        self._actions: dict[str, str] = {}  # run id -> what is being done to it (Stop, Pull)
        self._shown_points = (-1, -1)
        self._lines: dict[str, deque[str]] = {}
        super().__init__(parent)
        self.views = QStackedWidget()
        self.empty_label = QLabel("No run is shown. Open one from Runs, or start one from New fine-tune.")
        self.empty_label.setWordWrap(True)
        self.empty_label.setAccessibleName("No run shown")
        self.views.addWidget(self.empty_label)
        self.views.addWidget(self._build_content())
        self.body.addWidget(self.views, 1)
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.on_timer)
        context.manager.add_listener(self.on_run_line)

    # -- building ------------------------------------------------------------------------------------------------

    def _build_content(self) -> QWidget:
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self._build_header())
        self.timeline = PhaseTimeline()
        layout.addWidget(self.timeline)
        self.busy_bar = QProgressBar()
        self.busy_bar.setAccessibleName("Run progress")
        self.busy_bar.setTextVisible(True)
        layout.addWidget(self.busy_bar)
        middle = QHBoxLayout()
        self.chart = LossChart()
        middle.addWidget(self.chart, 3)
        middle.addWidget(self._build_stats(), 2)
        layout.addLayout(middle, 3)
        self.problems_label = QLabel()
        self.problems_label.setWordWrap(True)
        self.problems_label.setAccessibleName("Problems")
        self.problems_label.setStyleSheet("QLabel { color: #c62828; }")
        layout.addWidget(self.problems_label)
        layout.addWidget(self._build_log(), 1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(content)
        page = QWidget()
        outer = QVBoxLayout(page)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll, 1)
        outer.addLayout(self._build_actions())  # outside the scrolled part: always in reach
        return page

    def _build_header(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.run_label = QLabel()
        self.run_label.setAccessibleName("Run")
        self.run_label.setWordWrap(True)
        self.state_label = QLabel()
        self.state_label.setAccessibleName("Run state")
        font = self.state_label.font()
        font.setBold(True)
        self.state_label.setFont(font)
        row.addWidget(self.run_label, 1)
        row.addWidget(self.state_label)
        return row

    def _build_stats(self) -> QGroupBox:
        box = QGroupBox("Now")
        form = QFormLayout(box)
        self.stats: dict[str, QLabel] = {}
        for key, label in _STAT_ROWS:
            value = QLabel("—")
            value.setAccessibleName(label)
            value.setWordWrap(True)
            form.addRow(label, value)
            self.stats[key] = value
        self.stats["adapter"].setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        return box

    def _build_log(self) -> QGroupBox:
        box = QGroupBox("Log")
        layout = QVBoxLayout(box)
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(LOG_LINES)
        self.log_view.setMinimumHeight(90)
        self.log_view.setAccessibleName("Run log")
        self.log_view.setPlaceholderText("Messages appear here while this window follows the run.")
        layout.addWidget(self.log_view)
        return box

    def _build_actions(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.stop_button = _button(
            "&Stop (keep checkpoint)", "Stop the run, keeping a checkpoint", self.on_stop_clicked
        )
        self.pull_button = _button("&Pull now", "Bring the newest checkpoint home now", self.on_pull_clicked)
        self.resume_button = _button("&Resume", "Resume the run", self.on_resume_clicked)
        self.move_button = _button(
            "Resume &elsewhere…", "Continue the run on another server", self.on_resume_elsewhere_clicked
        )
        self.folder_button = _button("Open &folder", "Open the run's folder", self.on_open_folder_clicked)
        self.action_label = QLabel()
        self.action_label.setWordWrap(True)
        self.action_label.setAccessibleName("Action status")
        for button in (self.stop_button, self.pull_button, self.resume_button, self.move_button, self.folder_button):
            row.addWidget(button)
        row.addWidget(self.action_label, 1)
        return row

    # -- choosing the run ----------------------------------------------------------------------------------------

    def show_run(self, run_id: str) -> None:
        """Shows the run ``run_id`` (any recorded run, live or ended) and starts following it.

        The first reading happens at once in the background; ``await page.refresh()`` to wait for it.
        """
        cancel_group(self, _READING)  # a reading started for an earlier choice is dropped
        self.run_id = run_id
        self.record, self.transitions = None, []
        self.progress, self._offset, self._shown_points = RunProgress(), 0, (-1, -1)
        self.action_label.setText(self._actions.get(run_id, ""))
        self.log_view.setPlainText("\n".join(self._lines.get(run_id, ())))
        self.chart.show_points([], [], [], [])
        self.run_label.setText(f"Run {run_id}")
        self.state_label.setText("Reading…")
        self.views.setCurrentIndex(1)
        self._set_buttons()
        self.timer.start()
        self.on_tick()

    async def load(self) -> None:
        """Reads the shown run again (nothing to do when no run is shown)."""
        await self.refresh()

    def showEvent(self, event: QShowEvent) -> None:
        """Follows the run again when the page comes into view."""
        super().showEvent(event)
        if self.run_id is not None:
            self.timer.start()
            self.on_tick()

    def hideEvent(self, event: QHideEvent) -> None:
        """Stops polling while the page is out of view."""
        super().hideEvent(event)
        self.timer.stop()

    # -- reading -------------------------------------------------------------------------------------------------

    def on_timer(self) -> None:
        """Polls while the page is in view (a run chosen while it is hidden is read once, then on showing)."""
        if self.isVisible():
            self.on_tick()
        else:
            self.timer.stop()

    @asyncSlot()
    async def on_tick(self) -> None:
        """Reads what is new (unless the previous reading is still going)."""
        if self._refreshing:
            return
        self._refreshing = True
        try:
            await self.refresh()
        finally:
            self._refreshing = False

    async def refresh(self) -> None:
        """Reads the run's record and its new events and shows them (a reading for an earlier choice is dropped).

        The record is one small SQLite read (the engine writes it on this thread too) and a poll usually finds a
        few hundred bytes of events, so both are read here; a backlog (a long run opened for the first time) is
        read and parsed in a worker thread, a chunk at a time.
        """
        run_id = self.run_id
        if run_id is None:
            return
        reading = CoroutineOperation(self, lambda _job: self._read(run_id), self._show_read, group=_READING)
        await reading.run().wait()

    async def _read(self, run_id: str) -> tuple[RunRecord, list[dict[str, Any]]] | None:
        """The run's record and transitions once its new events are applied; None when it cannot be read now."""
        try:
            record, transitions = self._read_record(run_id)
        except UnknownRunError:
            self._show_missing(run_id)
            return None
        except (sqlite3.Error, OSError) as exc:  # a locked or unreadable database: try again next poll
            self.state_label.setText(f"Cannot read the run's record ({exc}); retrying")
            return None
        if not await self._read_events(run_id):
            return None
        return record, transitions

    def _show_read(self, read: tuple[RunRecord, list[dict[str, Any]]] | None) -> None:
        if read is not None:
            self.record, self.transitions = read
            self._show_all()

    def _read_record(self, run_id: str) -> tuple[RunRecord, list[dict[str, Any]]]:
        store = self.context.store
        return store.get(run_id), store.transitions(run_id)

    async def _read_events(self, run_id: str) -> bool:
        """Applies the new events, chunk by chunk; False when the events file cannot be read now."""
        path = self.context.store.runs_dir / run_id / EVENTS_FILE_NAME
        while True:
            try:
                if _waiting_bytes(path, self._offset) <= INLINE_BYTES:
                    chunk = read_event_chunk(path, self._offset)
                else:
                    chunk = await off_ui_thread(self, read_event_chunk, path, self._offset)
            except OSError as exc:
                self.state_label.setText(f"Cannot read {path} ({exc}); retrying")
                return False
            if chunk.restarted:
                self.progress, self._shown_points = RunProgress(), (-1, -1)
            self._offset = chunk.offset
            self.progress.apply_all(chunk.events)
            if not chunk.more:
                return True

    def on_run_line(self, run_id: str, line: str) -> None:
        """Keeps the progress lines of every run; shows those of the shown run."""
        self._lines.setdefault(run_id, deque(maxlen=LOG_LINES)).append(line)
        if run_id == self.run_id:
            self.log_view.appendPlainText(line)

    # -- showing -------------------------------------------------------------------------------------------------

    def _show_missing(self, run_id: str) -> None:
        self.timer.stop()
        self.run_id, self.record = None, None
        self.empty_label.setText(f"Run {run_id} is no longer recorded on this computer. Open another from Runs.")
        self.views.setCurrentIndex(0)

    def _show_all(self) -> None:
        record, now = self.record, time.time()
        if record is None:
            return
        model, method = record.spec.get("base_model", "?"), record.spec.get("training", {}).get("method", "qlora")
        self.run_label.setText(f"Run {record.id} · {model} · {method} · {record.target or 'no machine yet'}")
        following = " (followed by this window)" if self.context.manager.is_driving(record.id) else ""
        self.state_label.setText(record.state.value.capitalize() + following)
        self.timeline.show_spans(phase_durations(self.transitions, now))
        self._show_busy(record.state)
        self._show_chart()
        self._show_stats(record, now)
        self._show_problems(record)
        self._set_buttons()

    def _show_busy(self, state: RunState) -> None:
        progress, bar = self.progress, self.busy_bar
        text = BUSY_TEXT.get(state) or (JOB_TEXT.get(progress.job_state or "") if state is RunState.TRAINING else None)
        if text is None and state is RunState.TRAINING and progress.total_steps > 0:
            bar.setRange(0, progress.total_steps)
            bar.setValue(min(progress.step, progress.total_steps))
            bar.setFormat("Training: step %v of %m (%p %)")
        elif text is not None:
            bar.setRange(0, 0)  # busy: no measure of how far along it is
            bar.setFormat(text)
        else:
            done = state is RunState.FINISHED
            bar.setRange(0, 1)
            bar.setValue(1 if done else 0)
            bar.setFormat(_END_TEXT.get(state, "Training is starting…"))
        bar.setAccessibleDescription(bar.format())

    def _show_chart(self) -> None:
        counts = (len(self.progress.losses), len(self.progress.eval_losses))
        if counts == self._shown_points:
            return
        progress = self.progress
        self.chart.show_points(
            progress.loss_steps, progress.losses, progress.eval_steps, progress.eval_losses, progress.total_steps
        )
        self._shown_points = counts

    def _show_stats(self, record: RunRecord, now: float) -> None:
        for key, text in _stats_text(self.progress, record, self.transitions, now).items():
            if self.stats[key].text() != text:
                self.stats[key].setText(text)

    def _show_problems(self, record: RunRecord) -> None:
        lines = [
            f"<b>{error.kind}</b>: {_escape(error.message)}<br>What to do: {_escape(error.hint)}"
            for error in self.progress.errors[-3:]
        ]
        if record.error and not any(error.message in record.error for error in self.progress.errors):
            lines.append(_escape(record.error))
        self.problems_label.setText("<br>".join(lines))
        self.problems_label.setVisible(bool(lines))

    def _set_buttons(self) -> None:
        state = self.record.state if self.record else None
        idle = self.run_id not in self._actions and state is not None
        self.stop_button.setEnabled(idle and state in STOPPABLE)
        self.pull_button.setEnabled(idle and state in PULLABLE)
        self.resume_button.setEnabled(idle and state in RESUMABLE)
        self.move_button.setEnabled(idle and state in RESUMABLE)
        self.folder_button.setEnabled(self.run_id is not None)

    # -- actions -------------------------------------------------------------------------------------------------

    def on_stop_clicked(self) -> None:
        """Asks first, then stops the run keeping a checkpoint."""
        if self.run_id is None or not confirm(
            self,
            "Stop this run?",
            "The trainer saves a checkpoint, it is brought home, and the run ends as cancelled. "
            "You can start a new run from that checkpoint later. Stop now?",
        ):
            return
        self.stop_run()

    @asyncSlot()
    async def stop_run(self) -> None:
        """Stops the shown run (the trainer saves a checkpoint, which comes home) without asking."""
        run_id = self.run_id
        if run_id is None:
            return
        busy = "Stopping: saving a checkpoint and bringing it home…"
        ok, record = await self._act(run_id, busy, self.context.manager.stop(run_id))
        if ok and record is not None:
            self._done_acting(run_id, f"Run {record.state.value}." + (f" {record.error}" if record.error else ""))

    @asyncSlot()
    async def on_pull_clicked(self) -> None:
        """Brings the newest checkpoint home now."""
        run_id = self.run_id
        if run_id is None:
            return
        pulling = self.context.manager.pull(run_id)
        ok, folder = await self._act(run_id, "Pulling the newest checkpoint…", pulling)
        if ok:
            self._done_acting(run_id, f"Newest checkpoint is at {folder}" if folder else "No checkpoint saved yet.")

    def on_resume_clicked(self) -> None:
        """Continues a paused or failed run on its machine."""
        if self.run_id is None:
            return
        self.context.manager.resume(self.run_id)
        self.action_label.setText("Resuming: reconnecting to the machine…")
        self.on_tick()

    def on_resume_elsewhere_clicked(self) -> None:
        """Continues a paused or failed run on another server (a lost spot machine, a broken box)."""
        if self.run_id is None or self.record is None:
            return
        target = ask_new_target(self, _current_target(self.record))
        if target is None:
            self.action_label.setText("Not moved: enter the new server's host and user.")
            return
        self.context.manager.resume(self.run_id, target)
        self.action_label.setText(f"Moving to {target.url}: the newest checkpoint on this computer goes along…")
        self.on_tick()

    def on_open_folder_clicked(self) -> None:
        """Opens the run's folder (events, checkpoints, adapter) in the file manager."""
        if self.run_id is None:
            return
        folder = self.context.store.runs_dir / self.run_id
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self.action_label.setText(f"Could not open a file manager; the run's files are in {folder}")

    async def _act(self, run_id: str, busy: str, work: Awaitable[T]) -> tuple[bool, T | None]:
        """Runs an action on a run with its buttons disabled; (False, None) when it failed (the error is shown)."""
        self._actions[run_id] = busy
        if run_id == self.run_id:
            self.action_label.setText(busy)
            self._set_buttons()
        try:
            return True, await work
        except ACTION_ERRORS as exc:
            self._done_acting(run_id, f"That did not work: {exc}. Check the machine is reachable and try again.")
            return False, None
        except Exception:
            self._done_acting(run_id, "That did not work (details in the error message and the log).")
            raise  # to the app's error reporter, with the buttons usable again

    def _done_acting(self, run_id: str, message: str) -> None:
        self._actions.pop(run_id, None)
        if run_id == self.run_id:
            self.action_label.setText(message)
            self._set_buttons()
            self.on_tick()


_END_TEXT = {
    RunState.FINISHED: "Finished: the adapter is on this computer",
    RunState.PAUSED: "Paused: the machine could not be reached",
    RunState.FAILED: "Failed",
    RunState.CANCELLED: "Cancelled",
}


def _button(text: str, accessible: str, handler: Callable[[], object]) -> QPushButton:
    button = QPushButton(text)
    button.setAccessibleName(accessible)
    button.clicked.connect(lambda _checked=False: handler())
    return button


def _waiting_bytes(path: Path, offset: int) -> int:
    """Bytes after ``offset`` (negative when the file was replaced by a shorter one; 0 when it is missing)."""
    try:
        return path.stat().st_size - offset
    except FileNotFoundError:
        return 0


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _stats_text(
    progress: RunProgress, record: RunRecord, transitions: list[dict[str, Any]], now: float
) -> dict[str, str]:
    """The text of each row of the "Now" box."""
    rate = float(record.spec.get("hourly_rate_usd") or 0.0)
    return {
        "step": _step_text(progress),
        "eta": _eta_text(progress, record.state, now),
        "loss": _loss_text(progress),
        "speed": f"{progress.tokens_per_s:,.0f} tokens/s" if progress.tokens_per_s is not None else "—",
        "gpu_memory": _gpu_memory_text(progress),
        "gpu_util": f"{progress.gpu_util:.0f} %" if progress.gpu_util is not None else "—",
        "lr": f"{progress.learning_rate:.2e}" if progress.learning_rate is not None else "—",
        "cost": f"${cost_so_far(rate, transitions, now):,.2f} at ${rate:,.2f}/h" if rate else "No hourly rate set",
        "checkpoints": _checkpoints_text(progress),
        "adapter": _adapter_text(progress, record),
    }


def _step_text(progress: RunProgress) -> str:
    if not progress.step:
        return "—"
    total = f" of {progress.total_steps:,}" if progress.total_steps else ""
    return f"{progress.step:,}{total} · epoch {progress.epoch:.2f}"


def _eta_text(progress: RunProgress, state: RunState, now: float) -> str:
    eta = progress.eta_seconds
    if state is not RunState.TRAINING or eta is None:
        return "—"
    since = now - progress.last_ts if progress.last_ts else 0.0
    return f"about {format_duration(max(0.0, eta - since))}"


def _loss_text(progress: RunProgress) -> str:
    if not progress.losses:
        return "—"
    text = f"{progress.losses[-1]:.4f}"
    return text + (f" · eval {progress.eval_losses[-1]:.4f}" if progress.eval_losses else "")


def _gpu_memory_text(progress: RunProgress) -> str:
    if progress.gpu_mem_allocated_gb is None:
        return "—"
    reserved = progress.gpu_mem_reserved_gb
    return f"{progress.gpu_mem_allocated_gb:.1f} GB peak allocated" + (
        f" · {reserved:.1f} GB reserved" if reserved is not None else ""
    )


def _checkpoints_text(progress: RunProgress) -> str:
    if not progress.checkpoints:
        return "None yet"
    newest = progress.checkpoints[-1]
    return f"{len(progress.checkpoints)} saved · newest at step {newest.step:,} ({newest.bytes / 1e6:,.1f} MB)"


def _adapter_text(progress: RunProgress, record: RunRecord) -> str:
    if record.adapter:
        return record.adapter
    if progress.done is not None:
        return "Saved on the machine; coming home…"
    return "—"


def _current_target(record: RunRecord) -> SshTarget | None:
    """The run's present server, to prefill the move dialog (user, port, key, interpreter)."""
    if not record.target:
        return None
    user, host, port = parse_ssh_url(record.target)
    identity = record.spec.get("identity")
    return SshTarget(user, host, port, Path(identity) if identity else None, record.spec.get("python", "python3"))
