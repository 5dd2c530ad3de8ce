"""Wizard step "Data": pick the dataset; it is checked and prepared on this computer before any GPU is rented."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.core.data.findings import Severity
from desktop.core.runs.draft import DEFAULT_TRAINING, RunDraft
from desktop.services.data.prepare import PrepareError
from desktop.services.data.workspace import DatasetCheck, check_and_prepare, load_saved_check
from desktop.services.platform.logs import get_logger
from desktop.ui.background import Job, Operation, Running
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.step_base import WizardStep

FILE_FILTER = "Datasets (*.jsonl *.json *.ndjson *.csv *.tsv *.parquet *.pq);;All files (*)"
PROGRESS_STEPS = 1000
PREVIEW_CHARS = 400
LINES_SHOWN = 10
_SEVERITY_TEXT = {Severity.ERROR.value: "✖ Error", Severity.WARNING.value: "⚠ Warning"}
_FINDING_COLUMNS = ["Severity", "Problem", "Rows", "Lines", "How to fix"]
_log = get_logger("ui.data_step")


def counted(count: int, noun: str) -> str:
    """``1 error``, ``3 errors``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def summary_text(check: DatasetCheck) -> str:
    """One paragraph on the outcome: usable or not, rows kept, errors, warnings and tokens."""
    name = Path(check.source).name
    if check.fatal:
        return f"✖ {name} cannot be used: {check.fatal}."
    report = check.report
    errors, warnings = check.count(Severity.ERROR), check.count(Severity.WARNING)
    text = (
        f"✔ {name} ({report['format'] or 'format unknown'}): {check.kept:,} of {report['rows']:,} rows kept for "
        f"training · {counted(errors, 'error')} · {counted(warnings, 'warning')}"
    )
    tokens = report.get("tokens")
    if tokens:
        text += f" · {tokens['trained']:,} tokens trained per epoch ({tokens['method']})"
    if check.kept < report["rows"]:
        text += ". Rows with errors and repeated rows are left out of the prepared files"
    return text + "."


def lines_text(finding: dict[str, Any]) -> str:
    """The first line numbers of a finding, with "…" when there are more."""
    shown = ", ".join(str(line) for line in finding["lines"][:LINES_SHOWN])
    return shown + (" …" if finding["count"] > LINES_SHOWN else "")


def format_preview(conversations: list[list[dict[str, Any]]]) -> str:
    """Conversations as "role: content" lines, long messages shortened."""
    blocks = []
    for number, messages in enumerate(conversations, start=1):
        lines = [f"— Example {number} —"]
        for message in messages:
            content = str(message.get("content") or "")
            short = content if len(content) <= PREVIEW_CHARS else content[:PREVIEW_CHARS] + " …"
            lines.append(f"{message.get('role', '?')}: {short}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


class DataStep(WizardStep):
    """Chooses the dataset file, checks it off the UI thread, shows the report and prepares the files to upload."""

    step_name = "data"
    title = "Data"
    purpose = (
        "Choose your chat dataset (JSONL, CSV or Parquet). It is checked and prepared on this computer, before any "
        "GPU is billing: problems are listed with their line and how to fix them."
    )

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.check: DatasetCheck | None = None
        self._checked_path = ""
        self._problem = ""
        self._checking: Running[DatasetCheck] | None = None
        self.body.addLayout(self._build_picker())
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, PROGRESS_STEPS)
        self.progress_bar.setAccessibleName("Dataset check progress")
        self.progress_bar.hide()
        self.summary_label = QLabel("No file chosen yet.")
        self.summary_label.setWordWrap(True)
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.summary_label.setAccessibleName("Dataset check summary")
        self.body.addWidget(self.progress_bar)
        self.body.addWidget(self.summary_label)
        self.body.addWidget(self._build_tabs(), 1)

    # -- layout ---------------------------------------------------------------------------------------------------

    def _build_picker(self) -> QHBoxLayout:
        row = QHBoxLayout()
        label = QLabel("Dataset &file")
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("Path to a .jsonl, .csv or .parquet file of conversations")
        self.path_edit.setAccessibleName("Dataset file path")
        label.setBuddy(self.path_edit)
        self.path_edit.returnPressed.connect(self.on_path_confirmed)
        self.path_edit.editingFinished.connect(self.on_path_entered)
        self.choose_button = QPushButton("&Choose file…")
        self.choose_button.setAccessibleName("Choose the dataset file")
        self.choose_button.clicked.connect(self.on_choose_clicked)
        row.addWidget(label)
        row.addWidget(self.path_edit, 1)
        row.addWidget(self.choose_button)
        return row

    def _build_tabs(self) -> QTabWidget:
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Dataset report")
        self.findings_table = QTableWidget(0, len(_FINDING_COLUMNS))
        self.findings_table.setAccessibleName("Problems found, with their lines and how to fix them")
        self.findings_table.setHorizontalHeaderLabels(_FINDING_COLUMNS)
        self.findings_table.verticalHeader().setVisible(False)
        self.findings_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.findings_table.setWordWrap(True)
        header = self.findings_table.horizontalHeader()
        for column, mode in enumerate(
            [QHeaderView.ResizeMode.ResizeToContents] * 3 + [QHeaderView.ResizeMode.Stretch] * 2
        ):
            header.setSectionResizeMode(column, mode)
        self.preview_text = QPlainTextEdit()
        self.preview_text.setReadOnly(True)
        self.preview_text.setAccessibleName("Preview of the first examples as the model will see them")
        self.tabs.addTab(self.findings_table, "Fin&dings")
        self.tabs.addTab(self._build_histogram(), "&Token lengths")
        self.tabs.addTab(self.preview_text, "&Preview")
        return self.tabs

    def _build_histogram(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.histogram_plot = pg.PlotWidget()
        self.histogram_plot.setAccessibleName("Histogram of example lengths in tokens, against the sequence length")
        self.histogram_plot.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.histogram_plot.setBackground(None)
        text = self.palette().color(QPalette.ColorRole.WindowText)
        plot = self.histogram_plot.getPlotItem()
        for side, title in (("bottom", "tokens per example"), ("left", "examples")):
            plot.setLabel(side, title, color=text.name())
            plot.getAxis(side).setTextPen(text)
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        self.histogram_bars = pg.BarGraphItem(x0=[], width=[], height=[], brush=pg.mkBrush(70, 130, 200))
        self.seq_len_line = pg.InfiniteLine(
            angle=90,
            movable=False,
            pen=pg.mkPen(200, 60, 60, width=2),
            label="sequence length {value:.0f}",
            labelOpts={"position": 0.9, "color": text, "anchors": [(1, 0), (1, 0)]},
        )
        plot.addItem(self.histogram_bars)
        plot.addItem(self.seq_len_line)
        self.histogram_caption = QLabel("")
        self.histogram_caption.setWordWrap(True)
        self.histogram_caption.setAccessibleName("Token length statistics")
        layout.addWidget(self.histogram_plot, 1)
        layout.addWidget(self.histogram_caption)
        return box

    # -- the wizard's interface -----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a check is in progress."""
        return self._checking is not None and self._checking.active

    @property
    def _task(self) -> asyncio.Task[None] | None:
        """The task of the latest check; it ends cancelled when that check is dropped."""
        return self._checking.task if self._checking is not None else None

    @property
    def _cancel(self) -> threading.Event | None:
        """The latest check's cancel flag, polled by the worker at each progress point."""
        return self._checking.job.cancel if self._checking is not None else None

    def show_draft(self) -> None:
        """Shows the draft's dataset: the remembered report when still valid, else checks the file again."""
        path = self.draft.data_file
        if self._is_current(path):
            return
        self.path_edit.setText(path)
        if path:
            self.start_check(path, reuse=self.draft.train_file)
        else:
            self._stop_running()
            self._reset("No file chosen yet.")

    def validate(self) -> str | None:
        """Blocks Next until a usable file has been checked and prepared; says what to do otherwise."""
        path = self.path_edit.text().strip()
        if not path:
            return "Choose your dataset first: a JSONL, CSV or Parquet file of conversations (Choose file…)."
        if path != self._checked_path:
            return f"Press Enter in the file field to check {path} first."
        if self.running:
            return "The dataset is still being checked; Next works once the check is done."
        return self._problem or self._result_problem(Path(path).name)

    def _result_problem(self, name: str) -> str | None:
        if self.check is None or self.check.fatal:
            reason = self.check.fatal if self.check else "it was not checked"
            return f"{name} cannot be used: {reason}. Fix it, then choose the file again."
        if not self.check.usable:
            return f"Nothing could be prepared from {name}; fix the rows listed under Findings."
        return None

    def save_into(self, draft: RunDraft) -> None:
        """Records the picked file and, when prepared, the files to upload."""
        draft.data_file = self.path_edit.text().strip()
        usable = self.check is not None and self.check.usable and draft.data_file == self._checked_path
        draft.train_file = self.check.train_file if usable and self.check else ""
        draft.eval_file = self.check.eval_file if usable and self.check else ""

    async def load(self) -> None:
        """Waits for a check the draft started, so the first screen shows its report."""
        if self._checking is not None:
            await self._checking.wait()

    # -- handlers -------------------------------------------------------------------------------------------------

    def on_choose_clicked(self) -> None:
        """Opens a file dialog and checks the file chosen."""
        start = str(Path(self.path_edit.text()).expanduser().parent) if self.path_edit.text() else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a dataset", start, FILE_FILTER)
        if path:
            self.path_edit.setText(path)
            self.start_check(path)

    def on_path_confirmed(self) -> None:
        """Enter in the path field checks the file (again, when it was checked before)."""
        path = self.path_edit.text().strip()
        if path and not (path == self._checked_path and self.running):
            self.start_check(path)

    def on_path_entered(self) -> None:
        """Leaving the path field checks a newly typed path."""
        path = self.path_edit.text().strip()
        if path and path != self._checked_path:
            self.start_check(path)

    # -- checking -------------------------------------------------------------------------------------------------

    def _seq_len(self) -> int:
        return int(self.draft.training.get("seq_len", DEFAULT_TRAINING["seq_len"]))

    def _is_current(self, path: str) -> bool:
        """Whether what is shown (or being checked) already answers for ``path`` with today's settings."""
        if not path or path != self._checked_path:
            return False
        if self.running or self._problem:
            return True
        settings = (self._seq_len(), self.draft.base_model)
        return self.check is not None and (self.check.seq_len, self.check.model) == settings

    def start_check(self, path: str, *, reuse: str = "") -> None:
        """Checks and prepares ``path`` off the UI thread, cancelling a check still running.

        Args:
            path: The dataset file.
            reuse: A prepared training file whose remembered report may be shown instead, if still valid.
        """
        self._stop_running()
        self._checked_path = path
        self.draft.data_file, self.draft.train_file, self.draft.eval_file = path, "", ""
        self._reset(f"Checking {Path(path).name}…")
        self.progress_bar.setValue(0)
        self.progress_bar.show()
        seq_len, model = self._seq_len(), self.draft.base_model
        _log.info("checking %s (seq_len %d)", path, seq_len)
        self._checking = (
            Operation(self, lambda job: _check(Path(path), reuse, seq_len, model, job), self._show_check, group="check")
            .with_progress(self._on_progress)
            .failure(lambda exc: self._show_failure(path, exc), OSError, PrepareError)
            .failure(self._show_unexpected)
            .run()
        )
        self.sig_changed.emit()

    def _show_unexpected(self, exc: Exception) -> None:
        """Says the check broke, then sends the error on to the app's error reporter."""
        self._problem = f"The check stopped unexpectedly ({exc}); press Enter in the file field to try again."
        self.progress_bar.hide()
        self.summary_label.setText("✖ " + self._problem)
        raise exc

    def _stop_running(self) -> None:
        if self._checking is not None and self._checking.active:
            _log.info("cancelling the check of %s", self._checked_path)
            self._checking.cancel()

    def _on_progress(self, fraction: float) -> None:
        self.progress_bar.setValue(round(fraction * PROGRESS_STEPS))

    def _show_failure(self, path: str, exc: OSError | PrepareError) -> None:
        _log.warning("checking %s failed: %s", path, exc)
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            self._problem = (
                f"Could not read {path} ({reason}). Check the file exists and is readable, then press Enter."
            )
        else:
            self._problem = f"{exc}. Fix the file, then press Enter in the file field to check it again."
        self.progress_bar.hide()
        self.summary_label.setText("✖ " + self._problem)
        self.sig_changed.emit()

    # -- showing the report ---------------------------------------------------------------------------------------

    def _reset(self, message: str) -> None:
        self.check = None
        self._problem = ""
        self.progress_bar.hide()
        self.summary_label.setText(message)
        self.findings_table.setRowCount(0)
        self.tabs.setTabText(0, "Fin&dings")
        self.histogram_bars.setOpts(x0=[], width=[], height=[])
        self.seq_len_line.setValue(self._seq_len())
        self.histogram_caption.clear()
        self.preview_text.clear()

    def _show_check(self, check: DatasetCheck) -> None:
        _log.info("%s: %s", check.source, "usable" if check.usable else f"unusable ({check.fatal})")
        self.check = check
        self.progress_bar.hide()
        self.summary_label.setText(summary_text(check))
        self._show_findings(check.report.get("findings", []))
        self._show_histogram(check)
        self.preview_text.setPlainText(format_preview(check.preview) or "No example could be kept to show.")
        if check.usable:
            self.save_into(self.draft)
        self.sig_changed.emit()

    def _show_findings(self, findings: list[dict[str, Any]]) -> None:
        table = self.findings_table
        table.setRowCount(len(findings))
        for row, finding in enumerate(findings):
            problem = "\n".join([finding["title"], *finding["details"]])
            cells = [_SEVERITY_TEXT[finding["severity"]], problem, f"{finding['count']:,}", lines_text(finding)]
            for column, text in enumerate([*cells, finding["fix"]]):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                table.setItem(row, column, item)
        table.resizeRowsToContents()
        self.tabs.setTabText(0, f"Fin&dings ({sum(f['count'] for f in findings):,})")

    def _show_histogram(self, check: DatasetCheck) -> None:
        bars = check.histogram
        self.histogram_bars.setOpts(
            x0=[bar.start for bar in bars], width=[bar.width for bar in bars], height=[bar.count for bar in bars]
        )
        self.seq_len_line.setValue(check.seq_len)
        tokens = check.report.get("tokens")
        if not tokens:
            self.histogram_caption.setText("No example could be measured.")
            return
        p = tokens["percentiles"]
        self.histogram_caption.setText(
            f"Counted with the {tokens['method']}. Median {p['p50']:,} tokens, 90 % under {p['p90']:,}, longest "
            f"{p['max']:,}. Truncation cuts {tokens['cut']:,} tokens from {counted(tokens['too_long'], 'example')} "
            f"longer than the sequence length {check.seq_len:,}."
        )


def _check(path: Path, reuse: str, seq_len: int, model: str, job: Job) -> DatasetCheck:
    """The remembered report of ``reuse`` when still valid, else a new check (blocking; stops when cancelled).

    Raises:
        CheckCancelledError: The job was cancelled (a newer check started).
    """
    saved = load_saved_check(path, reuse, seq_len, model) if reuse else None
    return saved or check_and_prepare(path, seq_len=seq_len, model=model, progress=job.report, cancel=job.cancel)
