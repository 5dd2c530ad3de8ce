"""Every run recorded on this computer: state, model, method, when, how long, what it cost; open or delete one."""

from __future__ import annotations

import time
from dataclasses import dataclass

from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QStackedWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from qasync import asyncSlot

from desktop.core.runs.progress import cost_so_far, format_duration, run_duration
from desktop.core.runs.states import RunState
from desktop.services.runs.engine import RunBusyError
from desktop.services.runs.store import DELETABLE, RunLiveError, RunRecord, RunStore, UnknownRunError
from desktop.ui.background import Operation, spawn
from desktop.ui.context import AppContext
from desktop.ui.pages.base import BasePage
from desktop.ui.widgets.dialogs import confirm
from desktop.ui.widgets.tables import pick_one_table

REFRESH_MS = 2000
COLUMNS = ("Run", "State", "Model", "Method", "Started", "Duration", "Cost")


@dataclass(frozen=True)
class RunRow:
    """One line of the table, with the run's record."""

    record: RunRecord
    cells: tuple[str, ...]


def run_row(record: RunRecord, transitions: list[dict[str, object]], now: float) -> RunRow:
    """The table cells of a run: id, state, model, method, start time, duration and cost so far."""
    rate = float(record.spec.get("hourly_rate_usd") or 0.0)
    cost = f"${cost_so_far(rate, transitions, now):,.2f}" if rate else "—"
    return RunRow(
        record,
        (
            record.id,
            record.state.value.capitalize(),
            str(record.spec.get("base_model", "?")),
            str(record.spec.get("training", {}).get("method", "qlora")),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(record.started)),
            format_duration(run_duration(transitions, now)),
            cost,
        ),
    )


def read_rows(store: RunStore) -> list[RunRow]:
    """Every recorded run as a table row, newest first (blocking: reads the run database)."""
    now = time.time()
    return [run_row(record, store.transitions(record.id), now) for record in reversed(store.all())]


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
    purpose = "Every fine-tune started on this computer. Open one to follow it; delete the files of ended ones."
    sig_open_run = Signal(str)
    sig_new_run = Signal()

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        self.context = context
        self.rows: list[RunRow] = []
        self._loading = False
        super().__init__(parent)
        self.views = QStackedWidget()
        self.views.addWidget(self._build_empty())
        self.views.addWidget(self._build_table())
        self.body.addWidget(self.views, 1)
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.on_refresh_due)

    def _build_empty(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        self.empty_label = QLabel("No runs yet. Start your first one from New fine-tune.")
        self.empty_label.setWordWrap(True)
        self.empty_label.setAccessibleName("No runs yet")
        self.new_button = QPushButton("Start a &new fine-tune")
        self.new_button.setAccessibleName("Start a new fine-tune")
        self.new_button.clicked.connect(lambda _checked=False: self.sig_new_run.emit())
        layout.addWidget(self.empty_label)
        layout.addWidget(self.new_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addStretch(1)
        return box

    def _build_table(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.table = pick_one_table(COLUMNS, "Runs", stretch_column=2)
        self.table.activated.connect(self.on_row_activated)  # Enter, or a double-click
        self.table.itemSelectionChanged.connect(self.on_selection_changed)
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        self.open_button = QPushButton("&Open in monitor")
        self.open_button.setAccessibleName("Open the selected run in the monitor")
        self.open_button.clicked.connect(lambda _checked=False: self.open_selected())
        self.delete_button = QPushButton("&Delete local files…")
        self.delete_button.setAccessibleName("Delete the selected run's local files")
        self.delete_button.clicked.connect(lambda _checked=False: self.on_delete_clicked())
        self.hint_label = QLabel()
        self.hint_label.setWordWrap(True)
        self.hint_label.setAccessibleName("About the selected run")
        row.addWidget(self.open_button)
        row.addWidget(self.delete_button)
        row.addWidget(self.hint_label, 1)
        layout.addLayout(row)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setAccessibleName("Runs status")
        layout.addWidget(self.status_label)
        self.on_selection_changed()
        return box

    # -- loading -------------------------------------------------------------------------------------------------

    async def load(self) -> None:
        """Reads every run and its history (off the UI thread) and shows them."""
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
                    table.setItem(index, column, QTableWidgetItem(text))
                elif item.text() != text:
                    item.setText(text)
        ids = [row.record.id for row in rows]
        if selected is not None and selected.id in ids:
            table.selectRow(ids.index(selected.id))
        elif rows and table.currentRow() < 0:
            table.selectRow(0)
        self.on_selection_changed()

    # -- acting on a run ----------------------------------------------------------------------------------------

    def selected_record(self) -> RunRecord | None:
        """The run of the selected row, if any."""
        rows = self.table.selectionModel().selectedRows()
        if not rows or rows[0].row() >= len(self.rows):
            return None
        return self.rows[rows[0].row()].record

    def on_selection_changed(self) -> None:
        """Enables what the selected run allows and says why deleting is not possible for live runs."""
        record = self.selected_record()
        self.open_button.setEnabled(record is not None)
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

    def on_delete_clicked(self) -> None:
        """Deletes the selected ended run's folder and record, after asking; refuses live runs."""
        record = self.selected_record()
        if record is None:
            return
        if not self._deletable(record):
            self.status_label.setText(_live_message(record))
            return
        question = (
            f"Delete everything Rentune keeps on this computer for run {record.id}: its checkpoints, "
            f"{'adapter, ' if record.adapter else ''}event log and record? This cannot be undone."
        )
        if confirm(self, "Delete this run's files?", question):
            self.delete_run(record.id)

    def delete_run(self, run_id: str) -> None:
        """Deletes an ended run's files and record without asking (off the UI thread), then refreshes."""
        engine = self.context.manager.engine(run_id)
        Operation(self, lambda _job: engine.delete(run_id), lambda _none: self._deleted(run_id)).failure(
            self._not_deleted, RunLiveError, UnknownRunError, RunBusyError, OSError
        ).run()

    def _deleted(self, run_id: str) -> None:
        self.status_label.setText(f"Deleted run {run_id} and its files.")
        spawn(self.load())

    def _not_deleted(self, exc: Exception) -> None:
        self.status_label.setText(f"Not deleted: {exc}")

    def _deletable(self, record: RunRecord) -> bool:
        return record.state in DELETABLE and not self.context.manager.is_driving(record.id)


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
