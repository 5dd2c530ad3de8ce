"""The run monitor: phases and machines, loss curves, training readings, machine and cost, the log, and the actions.

The page tails the run's mirrored ``events.jsonl`` by byte offset every half second (reading only what is new, a
backlog off the UI thread) and re-reads the run's record, history, spend and files at home in a worker thread, so
it shows a run driven by this window, by a detached ``rentune`` process, or a run that ended long ago, all from the
run's files. Its words live in :mod:`.monitor_text` and :mod:`.monitor_log`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import asyncssh
import shiboken6
from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QHideEvent, QShowEvent
from PySide6.QtWidgets import QStackedWidget, QWidget
from qasync import asyncSlot

from desktop.core.runs.progress import RunProgress
from desktop.core.runs.spec import SshTarget, parse_ssh_url
from desktop.core.runs.states import RunState, flow_through
from desktop.core.runs.timeline import MachineMark, run_timeline
from desktop.services.billing.ledger import Ledger, LedgerError
from desktop.services.billing.meter import MeterReading
from desktop.services.billing.spend import RunSpend
from desktop.services.local.common import LocalToolError
from desktop.services.machines.ssh import RemoteError
from desktop.services.runs.actions import resume_refusal
from desktop.services.runs.engine import RunError
from desktop.services.runs.events import EventLine
from desktop.services.runs.snapshot import RunSnapshot, read_snapshot
from desktop.services.runs.store import RunRecord, UnknownRunError
from desktop.services.serving.dashboards import Dashboard, Tracker, start_dashboard
from desktop.ui.background import CoroutineOperation, cancel_group, off_ui_thread, spawn
from desktop.ui.context import AppContext
from desktop.ui.meter import CostMeter
from desktop.ui.pages import monitor_log, monitor_text
from desktop.ui.pages.base import BasePage
from desktop.ui.pages.monitor_view import MonitorView
from desktop.ui.run_words import is_rented, resume_question, resume_start, state_badge
from desktop.ui.widgets.blocks import EmptyState
from desktop.ui.widgets.dialogs import ask_new_target, ask_new_targets, confirm
from trainer_payload.protocol import EVENTS_FILE_NAME, EventTail, read_event_file

T = TypeVar("T")

POLL_MS = 500
#: The cost meter's count of a run is shown while it is at most this much older than the run's own reading.
METER_AGE_S = 10.0
#: Bytes of events read per read; a long backlog is read in several, the UI updating between them.
CHUNK_BYTES = 1 << 20
#: New bytes read on the UI thread; more (a backlog) is read in a worker thread. 20 events/s are ~3 KB a poll.
INLINE_BYTES = 64 << 10
LOG_LINES = 500
#: The operation group of the page's reading of the shown run.
_READING = "reading"
#: Errors an action on a run can meet: the machine unreachable, a refused login, a failed command, a refused resume.
ACTION_ERRORS = (RunError, RemoteError, OSError, asyncssh.Error, asyncio.TimeoutError)

#: Before the trainer's final work (syncing, pulling) a run can be stopped; a paused one too: its machine may answer.
STOPPABLE = flow_through(RunState.TRAINING) | {RunState.PAUSED, RunState.SERVING}
PULLABLE = frozenset({RunState.TRAINING})


def read_event_chunk(path: Path, offset: int, limit: int = CHUNK_BYTES) -> EventTail:
    """Reads the valid events of the complete lines after ``offset`` (at most ``limit`` bytes); blocking: a thread's.

    A file shorter than ``offset`` was replaced: it is read again from the start (``restarted``). Torn, malformed and
    over-long lines are skipped (see :func:`trainer_payload.protocol.read_event_file`).
    """
    return read_event_file(path, offset, limit)


class MonitorPage(BasePage):
    """Follows one run: what it is doing, how training goes, what it costs, and what can be done with it.

    Call :meth:`show_run` with a run id; the page then keeps itself current while it is visible.

    Signals:
        sig_open_models: Export or chat with the run's adapter, or its newest checkpoint: that folder's path.
    """

    sig_open_models = Signal(str)
    page_name = "monitor"
    title = "Run monitor"
    icon_name = "activity"
    scrolls = False
    purpose = "Progress streams here from the machine; checkpoints come home while it trains."

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        self.context = context
        self.run_id: str | None = None
        self.snapshot: RunSnapshot | None = None
        self.progress = RunProgress()
        self._offset = 0
        self._refreshing = False
        self._ledger: Ledger | None = None
        self._actions: dict[str, str] = {}  # run id -> what is being done to it (Stop, Pull, Resume)
        self._boards: dict[Path, Dashboard] = {}  # logs -> their dashboard, ended with the app
        self._starting_board = False
        self._shown_points: tuple[int, ...] = (-1,)
        self._lines: dict[str, deque[monitor_log.LogEntry]] = {}
        self._log_key: object = None
        self._metered: tuple[dict[str, RunSpend], float] = ({}, 0.0)  # the cost meter's last count, and when
        super().__init__(parent)
        self.views = QStackedWidget()
        self.empty_state = EmptyState(
            "activity",
            "No run is shown",
            "A run's progress, its loss, what it costs and its log appear here. Open one from Runs, or start one "
            "from New fine-tune.",
        )
        self.views.addWidget(self.empty_state)
        self.view = MonitorView()
        self.views.addWidget(self.view)
        self.body.addWidget(self.views, 1)
        self._expose_view()
        self._connect_actions()
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.on_timer)
        context.manager.add_listener(self.on_run_line)

    def _expose_view(self) -> None:
        """The view's parts under the names the page's callers and tests use."""
        view = self.view
        self.run_label, self.subtitle_label, self.state_badge = view.title_label, view.subtitle_label, view.badge
        self.banner, self.timeline, self.busy_bar, self.chart = view.banner, view.timeline, view.busy_bar, view.chart
        self.stats, self.machine = view.stats, view.machine
        self.log_view, self.action_label = view.log_view, view.action_label
        self.stop_button, self.pull_button, self.resume_button = view.stop_button, view.pull_button, view.resume_button
        self.move_button, self.folder_button = view.move_button, view.folder_button
        self.models_button, self.copy_address_button = view.models_button, view.copy_address_button
        self.tensorboard_button, self.trackio_button = view.tensorboard_button, view.trackio_button

    def _connect_actions(self) -> None:
        for button, handler in (
            (self.stop_button, self.on_stop_clicked),
            (self.pull_button, self.on_pull_clicked),
            (self.resume_button, self.on_resume_clicked),
            (self.move_button, self.on_resume_elsewhere_clicked),
            (self.folder_button, self.on_open_folder_clicked),
            (self.models_button, self.on_models_clicked),
            (self.copy_address_button, self.on_copy_address_clicked),
            (self.tensorboard_button, self.on_tensorboard_clicked),
            (self.trackio_button, self.on_trackio_clicked),
        ):
            button.clicked.connect(lambda _checked=False, handler=handler: handler())

    @property
    def record(self) -> RunRecord | None:
        """The shown run's record as last read (None before the first reading)."""
        return self.snapshot.record if self.snapshot else None

    # -- choosing the run ----------------------------------------------------------------------------------------

    def show_run(self, run_id: str) -> None:
        """Shows the run ``run_id`` (any recorded run, live or ended) and starts following it.

        Nothing of the run shown before stays: its curves, axes, readings and log go. The first reading happens at
        once in the background; ``await page.refresh()`` to wait for it.
        """
        cancel_group(self, _READING)  # a reading started for an earlier choice is dropped
        self.run_id, self.snapshot = run_id, None
        self.progress, self._offset, self._shown_points = RunProgress(), 0, (-1,)
        self.view.clear(f"Run {run_id}")
        self._log_key = None
        self._rebuild_log()
        self.action_label.setText(self._actions.get(run_id, ""))
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
        """Reads the run and its new events and shows them (a reading for an earlier choice is dropped).

        The record, history, spend and local files are read in a worker thread; a poll usually finds a few hundred
        bytes of events, read here, and a backlog (a long run opened for the first time) is read and parsed in a
        worker thread, a chunk at a time.
        """
        run_id = self.run_id
        if run_id is None:
            return
        reading = CoroutineOperation(self, lambda _job: self._read(run_id), self._show_read, group=_READING)
        await reading.run().wait()

    async def _read(self, run_id: str) -> RunSnapshot | None:
        """The run's snapshot once its new events are applied; None when it cannot be read now."""
        try:
            snapshot = await off_ui_thread(self, read_snapshot, self.context.store, run_id, self._ledger_for_reading())
        except UnknownRunError:
            self._show_missing(run_id)
            return None
        except (sqlite3.Error, OSError) as exc:  # a locked or unreadable database: try again next poll
            self.view.subtitle_label.setText(f"Cannot read the run's record now ({exc}); trying again")
            return None
        if not await self._read_events(run_id):
            return None
        return snapshot

    def _ledger_for_reading(self) -> Ledger | None:
        """The ledger, opened once (None when it cannot be opened: a rented run's cost then says why)."""
        if self._ledger is None:
            try:
                self._ledger = Ledger()
            except LedgerError:
                return None
        return self._ledger

    def _show_read(self, snapshot: RunSnapshot | None) -> None:
        if snapshot is not None and snapshot.record.id == self.run_id:
            self.snapshot = snapshot
            self._show_all(snapshot)

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
                self.view.subtitle_label.setText(f"Cannot read {path} now ({exc}); trying again")
                return False
            if chunk.restarted:
                self.progress, self._shown_points = RunProgress(), (-1,)
            self._offset = chunk.offset
            self.progress.apply_all(chunk.events)
            if not chunk.more:
                return True

    def on_run_line(self, run_id: str, line: str) -> None:
        """Keeps the engine's notes on every run (not its retelling of events: those come from the file)."""
        if isinstance(line, EventLine) or not shiboken6.isValid(self):  # a closed window hears nothing
            return
        self._lines.setdefault(run_id, deque(maxlen=LOG_LINES)).append(monitor_log.LogEntry(time.time(), line))
        if run_id == self.run_id:
            self._rebuild_log()

    # -- showing -------------------------------------------------------------------------------------------------

    def _show_missing(self, run_id: str) -> None:
        self.timer.stop()
        self.run_id, self.snapshot = None, None
        gone = EmptyState(
            "activity",
            "This run is gone",
            f"Run {run_id} is no longer recorded on this computer. Open another from Runs.",
        )
        gone.setAccessibleName(f"Run {run_id} is no longer recorded")
        old = self.views.widget(2)
        if old is not None:
            self.views.removeWidget(old)
            old.deleteLater()
        self.views.addWidget(gone)
        self.views.setCurrentWidget(gone)

    def _show_all(self, snapshot: RunSnapshot) -> None:
        progress, record = self.progress, snapshot.record
        following = self.context.manager.is_driving(record.id)
        self.view.show_header(
            monitor_text.title_text(snapshot), monitor_text.subtitle_text(snapshot, following), *state_badge(record)
        )
        self.view.title_label.setToolTip(monitor_text.title_tip(snapshot))
        self.view.show_notice(monitor_text.notice(progress, snapshot))
        marks = monitor_text.machine_marks(snapshot)
        self.timeline.show_items(run_timeline(snapshot.transitions, snapshot.now, marks), is_rented(record))
        self.view.show_busy(monitor_text.busy(progress, snapshot))
        self._show_chart()
        self.view.show_rows(self.stats, monitor_text.training_rows(progress, snapshot))
        self._show_machine(snapshot)
        self._rebuild_log()
        self._set_buttons()

    def follow(self, meter: CostMeter) -> None:
        """Shows the run's dollars from ``meter``'s readings: the very numbers of the status bar and the tray."""
        meter.sig_updated.connect(self.on_reading)
        if meter.latest is not None:
            self.on_reading(meter.latest)

    def on_reading(self, reading: MeterReading) -> None:
        """Keeps the cost meter's count of each run and redraws the shown run's cost with it."""
        self._metered = ({cost.run_id: cost.spend for cost in reading.overview.runs}, reading.now)
        if self.snapshot is not None and self.views.currentWidget() is self.view:
            self._show_machine(self.snapshot)

    def _show_machine(self, snapshot: RunSnapshot) -> None:
        """The machine and cost card; the dollars are the meter's when its reading is as new as the run's."""
        spends, read_at = self._metered
        metered = spends.get(snapshot.record.id)
        if metered is not None and read_at >= snapshot.now - METER_AGE_S:
            snapshot = replace(snapshot, spend=metered, spend_problem="")
        self.view.show_rows(self.machine, monitor_text.machine_rows(self.progress, snapshot))
        self.view.show_nodes(monitor_text.node_lines(snapshot))

    def _show_chart(self) -> None:
        progress = self.progress
        counts = (len(progress.losses), len(progress.eval_losses), len(progress.rewards), len(progress.eval_rewards))
        if counts == self._shown_points:
            return
        self.chart.show_points(
            progress.loss_steps, progress.losses, progress.eval_steps, progress.eval_losses, progress.total_steps
        )
        self.view.show_preference(progress.rewards, progress.eval_rewards, progress.total_steps)
        self._shown_points = counts

    def _rebuild_log(self) -> None:
        """The run's history from its files (transitions, events, machines) merged with this window's notes."""
        snapshot, notes = self.snapshot, list(self._lines.get(self.run_id or "", ()))
        if snapshot is not None and snapshot.record.id != self.run_id:
            snapshot = None
        if snapshot is None:
            self.view.show_log(monitor_log.log_lines(notes))
            return
        record = snapshot.record
        marks: list[MachineMark] = monitor_text.machine_marks(snapshot)
        last = self.progress.milestones[-1] if self.progress.milestones else None
        key = (
            record.id,
            record.state,
            record.spec.get("budget_stop"),
            len(snapshot.transitions),
            (len(self.progress.milestones), last.get("seq") if last else None),
            (len(notes), id(notes[-1]) if notes else None),
            tuple(marks),
        )
        if key == self._log_key:  # nothing new to tell: the log is not rebuilt at every poll
            return
        self._log_key = key
        stops = monitor_log.StopContext(
            by_user=record.state is RunState.CANCELLED and not record.spec.get("budget_stop"),
            budget=str(record.spec.get("budget_stop") or ""),
            stop_steps=monitor_log.stop_steps(self.progress.milestones),
        )
        entries = [
            *monitor_log.transition_entries(snapshot.transitions, stops),
            *monitor_log.event_entries(self.progress.milestones),
            *monitor_log.machine_entries(marks),
            *notes,
        ]
        self.view.show_log(monitor_log.log_lines(entries)[-LOG_LINES:])

    def _set_buttons(self) -> None:
        """Shows the actions the run's state allows, enabled unless one is under way; says why Resume cannot."""
        record = self.record
        state = record.state if record else None
        idle = self.run_id not in self._actions and record is not None
        refusal = resume_refusal(record) if record is not None else "the run is being read"
        resumable_state = state in {RunState.PAUSED, RunState.FAILED, RunState.CANCELLED}
        own_server = record is not None and not is_rented(record)
        for button, shown, usable in (
            (self.stop_button, state in STOPPABLE, state in STOPPABLE),
            (self.pull_button, state in PULLABLE, state in PULLABLE),
            (self.resume_button, resumable_state, refusal is None),
            (self.move_button, resumable_state and own_server, refusal is None),
        ):
            button.setVisible(shown or record is None)
            button.setEnabled(idle and usable)
        self.resume_button.setToolTip(f"Resume is not possible: {refusal}." if refusal else "")
        self.folder_button.setEnabled(self.run_id is not None)
        self.copy_address_button.setVisible(bool(self._served_url()))
        adapter_home = self._usable_adapter() is not None
        self.models_button.setVisible(adapter_home)
        self.models_button.setEnabled(adapter_home)
        files = self.snapshot.files if self.snapshot is not None else None
        self.tensorboard_button.setVisible(files is not None and files.tensorboard is not None)
        self.trackio_button.setVisible(files is not None and files.trackio is not None)

    def _usable_adapter(self) -> Path | None:
        """The run's adapter when it is home, else its newest complete checkpoint (None when neither is)."""
        if self.snapshot is None or self.run_id is None:
            return None
        files = self.snapshot.files
        if files.adapter is not None:
            return files.adapter
        if not files.checkpoint_steps:
            return None
        return self.context.store.runs_dir / self.run_id / "checkpoints" / f"checkpoint-{files.checkpoint_steps[-1]}"

    def _served_url(self) -> str:
        """The address the machine serves the tuned model at, while it does ("" otherwise)."""
        record = self.record
        if record is None or record.state is not RunState.SERVING:
            return ""
        return str((record.spec.get("serving") or {}).get("url") or "")

    def on_copy_address_clicked(self) -> None:
        """Copies the serving address, for a program's ``base_url``."""
        url = self._served_url()
        if url:
            QGuiApplication.clipboard().setText(url)
            self.action_label.setText(f"Copied {url} to the clipboard.")

    def on_models_clicked(self) -> None:
        """Opens the Models page on the run's adapter, or its newest checkpoint, to export, compare or chat."""
        usable = self._usable_adapter()
        if usable is not None:
            self.sig_open_models.emit(str(usable))

    # -- actions -------------------------------------------------------------------------------------------------

    def on_stop_clicked(self) -> None:
        """Asks first (saying what Resume can do afterwards), then stops the run keeping a checkpoint."""
        if self.run_id is None or self.snapshot is None:
            return
        title, question = monitor_text.stop_question(self.snapshot)
        if confirm(self, title, question, "&Stop the run", "&Keep it running"):
            self.stop_run()

    @asyncSlot()
    async def stop_run(self) -> None:
        """Stops the shown run (the trainer saves a checkpoint, which comes home) without asking."""
        run_id = self.run_id
        if run_id is None:
            return
        busy = "Stopping: saving a checkpoint and bringing it home…"
        if self.record is not None and self.record.state is RunState.SERVING:
            busy = "Stopping: serving ends, then the machine…"
        ok, record = await self._act(run_id, busy, self.context.manager.stop(run_id))
        if ok and record is not None:
            self._done_acting(run_id, _stopped_words(record))

    @asyncSlot()
    async def on_pull_clicked(self) -> None:
        """Brings the newest checkpoint home now."""
        run_id = self.run_id
        if run_id is None:
            return
        pulling = self.context.manager.pull(run_id)
        ok, folder = await self._act(run_id, "Bringing the newest checkpoint home…", pulling)
        if ok:
            self._done_acting(run_id, f"The newest checkpoint is in {folder}" if folder else "No checkpoint yet.")

    def on_resume_clicked(self) -> None:
        """Continues a paused, failed or stopped run (asking first when that rents a new machine)."""
        if self.run_id is None or self.snapshot is None:
            return
        question = resume_question(self.snapshot)
        if question is not None and not confirm(self, *question, "&Rent and resume", "&Not now"):
            return
        self._resume(None, "Resuming: reconnecting to the machine…")

    def on_resume_elsewhere_clicked(self) -> None:
        """Continues a paused, failed or stopped run on another server (a lost machine, a broken box)."""
        if self.run_id is None or self.record is None:
            return
        nodes = self.snapshot.nodes if self.snapshot is not None else ()
        if nodes:
            self._resume_on_servers([self.record, *nodes])
            return
        target = ask_new_target(self, _current_target(self.record))
        if target is None:
            self.action_label.setText("Not moved: enter the new server's host and user.")
            return
        self._resume(target, f"Moving to {target.url}: the newest checkpoint on this computer goes along…")

    def _resume_on_servers(self, records: list[RunRecord]) -> None:
        """A run on several machines moves to a fresh set of servers, one per machine, the head first."""
        current = [target for record in records if (target := _current_target(record)) is not None]
        targets = ask_new_targets(self, current) if len(current) == len(records) else ()
        if not targets:
            self.action_label.setText(f"Not moved: enter {len(records)} servers, one per machine, the head first.")
            return
        self._resume(
            None, f"Moving to {len(targets)} servers: the newest checkpoint on this computer goes along…", targets
        )

    def _resume(self, target: SshTarget | None, busy: str, targets: tuple[SshTarget, ...] = ()) -> None:
        run_id = self.run_id
        if run_id is None:
            return
        self._actions[run_id] = busy
        self.action_label.setText(busy)
        self._set_buttons()
        start = resume_start(self.snapshot) if self.snapshot is not None else "from its newest checkpoint"
        resuming = self.context.manager.resume_in_background(run_id, target, targets=targets)
        spawn(self._resume_in_background(run_id, resuming, busy, start))

    async def _resume_in_background(self, run_id: str, resuming: Awaitable[RunRecord], busy: str, start: str) -> None:
        self._actions.pop(run_id, None)  # _act marks it busy again for as long as the preparation takes
        ok, _record = await self._act(run_id, busy, resuming)
        if ok:
            self._done_acting(run_id, f"Resumed: the run continues {start}.")

    @asyncSlot()
    async def on_tensorboard_clicked(self) -> None:
        """Shows the run's newest TensorBoard event files in a TensorBoard here (started once per folder)."""
        await self._open_dashboard(Tracker.TENSORBOARD)

    @asyncSlot()
    async def on_trackio_clicked(self) -> None:
        """Shows the run's newest trackio database in trackio's dashboard here (started once per folder)."""
        await self._open_dashboard(Tracker.TRACKIO)

    async def _open_dashboard(self, tracker: Tracker) -> None:
        logs = self.snapshot.files.tracker_logs(tracker.value) if self.snapshot is not None else None
        if logs is None or self._starting_board:
            return  # a second click while it starts: the first opens it (the button keeps the focus)
        board = self._boards.get(logs)
        if board is None or not board.running:
            self._starting_board = True
            self.action_label.setText(f"Starting {tracker.label}…")
            try:
                board = self._boards[logs] = await start_dashboard(tracker, logs)
            except LocalToolError as exc:
                self.action_label.setText(f"{tracker.label} could not start: {exc}")
                return
            finally:
                self._starting_board = False
        self.action_label.setText(f"{tracker.label} is at {board.url} (this computer only, until the app closes).")
        if not QDesktopServices.openUrl(QUrl(board.url)):
            self.action_label.setText(f"Could not open a browser; {tracker.label} is at {board.url}")

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
        if run_id == self.run_id and shiboken6.isValid(self):  # an action can outlive its window: nothing to show
            self.action_label.setText(message)
            self._set_buttons()
            self.on_tick()


def _stopped_words(record: RunRecord) -> str:
    if record.state is RunState.CANCELLED:
        return "Stopped. The notice above says where Resume would continue."
    return f"The run is {record.state.value}." + (f" {record.error}" if record.error else "")


def _waiting_bytes(path: Path, offset: int) -> int:
    """Bytes after ``offset`` (negative when the file was replaced by a shorter one; 0 when it is missing)."""
    try:
        return path.stat().st_size - offset
    except FileNotFoundError:
        return 0


def _current_target(record: RunRecord) -> SshTarget | None:
    """The run's present server, to prefill the move dialog (user, port, key, interpreter)."""
    if not record.target:
        return None
    user, host, port = parse_ssh_url(record.target)
    identity = record.spec.get("identity")
    return SshTarget(user, host, port, Path(identity) if identity else None, record.spec.get("python", "python3"))
