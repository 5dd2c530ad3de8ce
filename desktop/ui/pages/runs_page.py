"""Every run recorded on this computer: its state as a badge, what it trained, when, how long and what it cost.

From here a run is opened in the monitor, resumed, or its files deleted (after naming what is lost).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from PySide6.QtCore import QModelIndex, QTimer, Signal
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import QHBoxLayout, QStackedWidget, QTableWidgetItem, QVBoxLayout, QWidget
from qasync import asyncSlot

from desktop.core.model_names import model_name
from desktop.core.runs.progress import format_duration, run_duration
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger, LedgerError
from desktop.services.buckets.client import BucketError
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.actions import resume_refusal
from desktop.services.runs.bucket_checkpoints import delete_from_bucket
from desktop.services.runs.bucket_data import BUCKET_KEY
from desktop.services.runs.engine import RunBusyError, RunError
from desktop.services.runs.snapshot import Footprint, RunSnapshot, footprint, read_snapshot
from desktop.services.runs.store import DELETABLE, RunLiveError, RunRecord, RunStore, UnknownRunError
from desktop.ui.background import Operation, spawn
from desktop.ui.context import AppContext
from desktop.ui.cost_words import money, rate
from desktop.ui.pages.base import BasePage
from desktop.ui.run_words import resume_question, state_badge, training_words
from desktop.ui.widgets.badge_delegate import SEVERITY_ROLE, BadgeDelegate
from desktop.ui.widgets.blocks import EmptyState, caption, destructive_button, plain_button, primary_button
from desktop.ui.widgets.dialogs import confirm, confirm_with_option
from desktop.ui.widgets.tables import pick_one_table

REFRESH_MS = 2000
COLUMNS = ("Run", "State", "Model", "Method", "Started", "Duration", "Cost")
STATE_COLUMN = COLUMNS.index("State")
MODEL_COLUMN = COLUMNS.index("Model")


@dataclass(frozen=True)
class RunRow:
    """One line of the table: the run as read, its cells, its state's badge colour and tooltips by column."""

    snapshot: RunSnapshot
    cells: tuple[str, ...]
    severity: str
    tips: dict[int, str] = field(default_factory=dict)

    @property
    def record(self) -> RunRecord:
        """The run's record."""
        return self.snapshot.record


def cost_cell(snapshot: RunSnapshot) -> str:
    """What the run cost so far (the count the monitor, status bar and tray show), and its rate while it bills."""
    spend = snapshot.spend
    if spend is None:
        return "Not known now"
    if not spend.rented and not float(snapshot.record.spec.get("hourly_rate_usd") or 0.0):
        return "—"
    return money(spend.usd) + (f" · {rate(spend.rate_per_hour)} now" if spend.billing else "")


def run_row(snapshot: RunSnapshot) -> RunRow:
    """The table cells of a run: id, state, model, method, start time, duration and cost so far."""
    record = snapshot.record
    words, severity = state_badge(record)
    base = str(record.spec.get("base_model", "?"))
    cells = (
        record.id,
        words,
        model_name(base),
        training_words(record.spec),
        time.strftime("%Y-%m-%d %H:%M", time.localtime(record.started)),
        format_duration(run_duration(snapshot.transitions, snapshot.now)),
        cost_cell(snapshot),
    )
    tips = {MODEL_COLUMN: base} if model_name(base) != base else {}  # a folder: its whole path on hover
    return RunRow(snapshot, cells, severity, tips)


def read_rows(store: RunStore) -> list[RunRow]:
    """Every recorded run as a table row, newest first (blocking: reads the run database and the ledger)."""
    try:
        ledger: Ledger | None = Ledger()
    except LedgerError:
        ledger = None  # rented runs' costs then say they are not known
    rows = []
    for record in reversed(store.all()):
        try:
            rows.append(run_row(read_snapshot(store, record.id, ledger)))
        except UnknownRunError:  # deleted meanwhile
            continue
    return rows


def delete_question(record: RunRecord, files: Footprint, spent: float | None) -> tuple[str, str]:
    """What deleting a run's files loses, named: the adapter it paid for, its checkpoints, its log."""
    lost = []
    if files.adapter_bytes:
        paid = f", which cost {money(spent)} to train" if spent else ""
        lost.append(f"• the trained adapter ({_size(files.adapter_bytes)}){paid}: it cannot be brought back")
    if files.checkpoints:
        many = "checkpoint" if files.checkpoints == 1 else "checkpoints"
        lost.append(f"• {files.checkpoints} {many} ({_size(files.checkpoint_bytes)}): the run can no longer resume")
    lost.append("• its history: the log, the loss curve and its record in this list")
    text = (
        f"This removes {_size(files.total_bytes)} from this computer:\n"
        + "\n".join(lost)
        + "\n\nThis cannot be undone."
    )
    return f"Delete run {record.id}?", text


def ask_delete(parent: QWidget, title: str, text: str, bucket: str | None = None) -> tuple[bool, bool]:
    """Asks before deleting, "Keep" being the default; (delete the run's files, its bucket checkpoints too).

    A run that used a bucket offers, unticked, to delete its checkpoints there as well.
    """
    if bucket is None:
        return confirm(parent, title, text, "&Delete run files", "&Keep", destructive=True), False
    option = f"Also delete its checkpoints in the bucket ({bucket})"
    return confirm_with_option(parent, title, text, "&Delete run files", "&Keep", option=option)


def bucket_of(record: RunRecord) -> str | None:
    """The address of the bucket a run used (``s3://…``), or None."""
    bucket = record.spec.get(BUCKET_KEY)
    return str(bucket.get("url")) if isinstance(bucket, dict) and bucket.get("url") else None


class RunsPage(BasePage):
    """Lists every run, newest first; Enter or a double-click opens one in the monitor.

    Signals:
        sig_open_run: A run id to show in the monitor.
        sig_new_run: The user asked to start a new fine-tune (from the empty state).
    """

    page_name = "runs"
    title = "Runs"
    icon_name = "list-checks"
    scrolls = False
    purpose = "Every fine-tune started on this computer. Open one to follow it; resume a stopped one; delete old ones."
    sig_open_run = Signal(str)
    sig_new_run = Signal()

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        self.context = context
        self.rows: list[RunRow] = []
        self._loading = False
        self._listed: set[str] | None = None  # the run ids last shown (None before the first reading)
        super().__init__(parent)
        self.status_label = caption()  # below both views: what became of the last run deleted stays said
        self.status_label.setAccessibleName("Runs status")
        self.views = QStackedWidget()
        self.views.addWidget(self._build_empty())
        self.views.addWidget(self._build_table())
        self.body.addWidget(self.views, 1)
        self.body.addWidget(self.status_label)
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.on_refresh_due)

    def _build_empty(self) -> QWidget:
        self.new_button = primary_button("Start a &new fine-tune", "wand-sparkles", "Start a new fine-tune")
        self.new_button.clicked.connect(lambda _checked=False: self.sig_new_run.emit())
        self.empty_state = EmptyState(
            "list-checks",
            "No runs yet",
            "Every fine-tune you start appears here with its state, what it cost and where its adapter is. Start "
            "one: pick your data and a model, then a rented GPU or your own server.",
            self.new_button,
        )
        return self.empty_state

    def _build_table(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.table = pick_one_table(COLUMNS, "Runs", stretch_column=2)
        self.badges = BadgeDelegate(self.table)
        self.table.setItemDelegateForColumn(STATE_COLUMN, self.badges)
        self.table.verticalHeader().setDefaultSectionSize(34)
        self.table.activated.connect(self.on_row_activated)  # Enter, or a double-click
        self.table.itemSelectionChanged.connect(self.on_selection_changed)
        layout.addWidget(self.table, 1)
        layout.addLayout(self._build_actions())
        self.on_selection_changed()
        return box

    def _build_actions(self) -> QVBoxLayout:
        column = QVBoxLayout()
        row = QHBoxLayout()
        self.open_button = primary_button("&Open in monitor", "activity", "Open the selected run in the monitor")
        self.open_button.clicked.connect(lambda _checked=False: self.open_selected())
        self.resume_button = plain_button("&Resume", "play", "Resume the selected run from its newest checkpoint")
        self.resume_button.clicked.connect(lambda _checked=False: self.on_resume_clicked())
        self.delete_button = destructive_button("&Delete run files…", "trash-2", "Delete the selected run's files")
        self.delete_button.clicked.connect(lambda _checked=False: self.on_delete_clicked())
        row.addWidget(self.open_button)
        row.addWidget(self.resume_button)
        row.addStretch(1)
        row.addWidget(self.delete_button)
        column.addLayout(row)
        self.hint_label = caption()
        self.hint_label.setAccessibleName("About the selected run")
        column.addWidget(self.hint_label)
        return column

    # -- loading -------------------------------------------------------------------------------------------------

    async def load(self) -> None:
        """Reads every run, its history and its spend (off the UI thread) and shows them."""
        store = self.context.store
        self._loading = True
        try:
            await Operation(self, lambda _job: read_rows(store), self._show_rows, group="rows").run().wait()
        finally:
            self._loading = False

    @asyncSlot()
    async def on_refresh_due(self) -> None:
        """Re-reads the runs (skipped while a reading is still going)."""
        if not self._loading:
            await self.load()

    def showEvent(self, event: QShowEvent) -> None:
        """Refreshes at once and then every few seconds while the page is in view."""
        super().showEvent(event)
        self.timer.start()
        self.on_refresh_due()

    def hideEvent(self, event: QHideEvent) -> None:
        """Stops refreshing while the page is out of view."""
        super().hideEvent(event)
        self.timer.stop()

    def _show_rows(self, rows: list[RunRow]) -> None:
        selected = self.selected_record()
        self.rows = rows
        self.views.setCurrentIndex(1 if rows else 0)
        table = self.table
        table.setRowCount(len(rows))
        for index, row in enumerate(rows):
            for column, text in enumerate(row.cells):
                item = table.item(index, column)
                if item is None:
                    item = QTableWidgetItem(text)
                    table.setItem(index, column, item)
                elif item.text() != text:
                    item.setText(text)
                item.setToolTip(row.tips.get(column, ""))
            state = table.item(index, STATE_COLUMN)
            if state is not None and state.data(SEVERITY_ROLE) != row.severity:
                state.setData(SEVERITY_ROLE, row.severity)
        ids = [row.record.id for row in rows]
        listed = set(ids) if self._listed is None else self._listed
        appeared = [index for index, run_id in enumerate(ids) if run_id not in listed]
        if appeared:  # a run launched since the list was last read: it is what the user looks for now
            table.selectRow(appeared[0])
        elif selected is not None and selected.id in ids:
            table.selectRow(ids.index(selected.id))
        elif rows and table.currentRow() < 0:
            table.selectRow(0)
        self._listed = set(ids)
        self.on_selection_changed()

    # -- acting on a run ----------------------------------------------------------------------------------------

    def selected_row(self) -> RunRow | None:
        """The selected row, if any."""
        rows = self.table.selectionModel().selectedRows()
        if not rows or rows[0].row() >= len(self.rows):
            return None
        return self.rows[rows[0].row()]

    def selected_record(self) -> RunRecord | None:
        """The run of the selected row, if any."""
        row = self.selected_row()
        return row.record if row is not None else None

    def on_selection_changed(self) -> None:
        """Enables what the selected run allows and says why deleting or resuming is not possible."""
        record = self.selected_record()
        self.open_button.setEnabled(record is not None)
        refusal = resume_refusal(record) if record is not None else None
        resumable = record is not None and record.state in {RunState.PAUSED, RunState.FAILED, RunState.CANCELLED}
        self.resume_button.setVisible(resumable)
        self.resume_button.setEnabled(resumable and refusal is None and not self._driven(record))
        self.resume_button.setToolTip(f"Resume is not possible: {refusal}." if refusal else "")
        deletable = record is not None and self._deletable(record)
        self.delete_button.setEnabled(deletable)
        self.hint_label.setText(_live_message(record) if record is not None and not deletable else "")

    def on_row_activated(self, index: QModelIndex) -> None:
        """Opens the activated run in the monitor."""
        if 0 <= index.row() < len(self.rows):
            self.sig_open_run.emit(self.rows[index.row()].record.id)

    def open_selected(self) -> None:
        """Opens the selected run in the monitor."""
        record = self.selected_record()
        if record is not None:
            self.sig_open_run.emit(record.id)

    def on_resume_clicked(self) -> None:
        """Resumes the selected run (asking first when that rents a machine) and opens it in the monitor."""
        row = self.selected_row()
        if row is None:
            return
        question = resume_question(row.snapshot)
        if question is not None and not confirm(self, *question, "&Rent and resume", "&Not now"):
            return
        self.resume_button.setEnabled(False)
        self.status_label.setText(f"Resuming run {row.record.id}…")
        spawn(self._resume(row.record.id))

    async def _resume(self, run_id: str) -> None:
        try:
            await self.context.manager.resume_in_background(run_id)
        except (RunError, UnknownRunError, OSError) as exc:
            self.status_label.setText(f"Not resumed: {exc}")
            self.on_selection_changed()
            return
        self.status_label.setText(f"Resumed run {run_id}: it continues from its newest checkpoint.")
        self.sig_open_run.emit(run_id)

    def on_delete_clicked(self) -> None:
        """Names what deleting the selected ended run loses (read off the UI thread), asks, then deletes."""
        row = self.selected_row()
        if row is None:
            return
        if not self._deletable(row.record):
            self.status_label.setText(_live_message(row.record))
            return
        store, record = self.context.store, row.record
        spent = row.snapshot.spend.usd if row.snapshot.spend else None
        reading = Operation(self, lambda _job: footprint(store, record), lambda f: self._ask_delete(record, f, spent))
        reading.failure(self._not_deleted, OSError).run()

    def _ask_delete(self, record: RunRecord, files: Footprint, spent: float | None) -> None:
        delete, with_bucket = ask_delete(self, *delete_question(record, files, spent), bucket_of(record))
        if delete:
            self.delete_run(record.id, with_bucket=with_bucket)

    def delete_run(self, run_id: str, *, with_bucket: bool = False) -> None:
        """Deletes an ended run's files and record without asking (off the UI thread), then refreshes.

        With ``with_bucket``, its checkpoints in its bucket go afterwards (only once the run is surely deletable).
        """
        engine, secrets = self.context.manager.engine(run_id), self.context.secrets

        def delete(_job: object) -> str:
            record = engine.store.get(run_id)
            engine.delete(run_id)
            return _bucket_words(record, secrets) if with_bucket else ""

        Operation(self, delete, lambda words: self._deleted(run_id, words)).failure(
            self._not_deleted, RunLiveError, UnknownRunError, RunBusyError, OSError
        ).run()

    def _deleted(self, run_id: str, bucket_words: str) -> None:
        self.status_label.setText(f"Deleted run {run_id} and its files.{bucket_words}")
        spawn(self.load())

    def _not_deleted(self, exc: Exception) -> None:
        self.status_label.setText(f"Not deleted: {exc}")

    def _deletable(self, record: RunRecord) -> bool:
        return record.state in DELETABLE and not self._driven(record)

    def _driven(self, record: RunRecord | None) -> bool:
        return record is not None and self.context.manager.is_driving(record.id)


def _size(size: int) -> str:
    if size >= 1e9:
        return f"{size / 1e9:,.1f} GB"
    if size >= 1e6:
        return f"{size / 1e6:,.1f} MB"
    return f"{max(size, 0) / 1e3:,.0f} KB"


def _bucket_words(record: RunRecord, secrets: SecretStore) -> str:
    """Deletes the run's checkpoints in its bucket (blocking); what became of them, as a sentence to append."""
    try:
        count, freed = delete_from_bucket(record, secrets)
    except BucketError as exc:
        return f" Its checkpoints in the bucket stay ({exc}); rentune storage rm {record.id} deletes them later."
    return f" Deleted its {count} checkpoint(s) in the bucket ({_size(freed)})."


def _live_message(record: RunRecord) -> str:
    if record.state is RunState.PAUSED:
        return (
            f"Run {record.id} is paused and can still be resumed, so its files are kept. "
            "Stop it from the monitor first if you no longer need it."
        )
    return (
        f"Run {record.id} is {record.state.value} and its files are in use. "
        "Stop it from the monitor (or let it finish) before deleting them."
    )
