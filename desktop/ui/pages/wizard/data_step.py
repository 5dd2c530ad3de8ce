"""Wizard step "Data": pick the dataset; it is checked and prepared on this computer before any GPU is rented."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.core.data.findings import Severity
from desktop.core.data.formats import DataFormat
from desktop.core.runs.draft import RunDraft
from desktop.services.data.prepare import PrepareError
from desktop.services.data.reader import FileProblem
from desktop.services.data.workspace import DatasetCheck, draft_settings, prepare_for_draft
from desktop.services.platform.logs import get_logger
from desktop.ui.background import Job, Operation, Running
from desktop.ui.context import AppContext
from desktop.ui.design.palette import Palette
from desktop.ui.pages.wizard.data_words import (
    counted,
    file_problem,
    fix_words,
    histogram_caption,
    summary,
)
from desktop.ui.pages.wizard.step_base import StepProblem, WizardStep
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.blocks import Badge, Banner, Card, caption, plain_button

FILE_FILTER = "Datasets (*.jsonl *.json *.ndjson *.csv *.tsv *.parquet *.pq *.txt *.md);;All files (*)"
PROGRESS_STEPS = 1000
PREVIEW_CHARS = 400
LINES_SHOWN = 10
REPORT_MIN_HEIGHT = 260
_SEVERITY_BADGES = {Severity.ERROR.value: ("Error", "danger"), Severity.WARNING.value: ("Warning", "warning")}
_FINDING_COLUMNS = ["Severity", "Problem", "Rows", "Lines", "How to fix"]
#: The roles a table's columns can be mapped to: (role, label, required).
ROLES = (
    ("user", "&User's message", True),
    ("assistant", "&Answer to learn", True),
    ("system", "S&ystem prompt", False),
)
NO_COLUMN = "(none)"
#: The token histogram's least height in pixels (bars, axis, axis titles).
HISTOGRAM_MIN_HEIGHT = 240
_log = get_logger("ui.data_step")


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


def shows_mapping(check: DatasetCheck) -> bool:
    """Whether the check is of a table whose columns the user maps to roles."""
    mapped = check.data_format == DataFormat.COLUMNS.value
    return bool(check.fields) and (mapped or check.fatal_kind == FileProblem.UNKNOWN_LAYOUT.value)


class ColumnMappingBox(Card):
    """Which column of a table holds the user's message, the answer and the system prompt: a choice per role."""

    #: Emitted with the complete mapping (role → column) when the user changes a choice.
    sig_mapping_chosen = Signal(dict)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Columns", "", parent)
        self.setAccessibleName("Which column holds what")
        self.hint_label = caption()
        self.body.addWidget(self.hint_label)
        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        self.combos: dict[str, QComboBox] = {}
        for column, (role, label, _required) in enumerate(ROLES):
            combo = QComboBox()
            combo.setAccessibleName(f"Column for the {label.replace('&', '').lower()}")
            combo.setMinimumContentsLength(12)
            combo.activated.connect(self.on_choice)
            role_label = QLabel(label)
            role_label.setBuddy(combo)
            grid.addWidget(role_label, 0, column)
            grid.addWidget(combo, 1, column)
            self.combos[role] = combo
        self.body.addLayout(grid)

    def show_columns(self, fields: list[str], mapping: dict[str, str] | None) -> None:
        """Lists ``fields`` in each box with ``mapping``'s choice selected (nothing selected when unmapped)."""
        self.hint_label.setText(
            "Which column holds what. Rentune chose these from the column names; change a choice and the file is "
            "checked again."
            if mapping
            else "Choose the column with the user's message and the one with the answer to learn; the file is "
            "checked again once both are chosen."
        )
        for role, _label, required in ROLES:
            combo = self.combos[role]
            combo.blockSignals(True)
            combo.clear()
            combo.addItems(fields if required else [NO_COLUMN, *fields])
            chosen = (mapping or {}).get(role)
            combo.setCurrentIndex(combo.findText(chosen) if chosen else (-1 if required else 0))
            combo.blockSignals(False)

    def mapping(self) -> dict[str, str] | None:
        """The mapping chosen, or None while the user's message or the answer has no column."""
        chosen = {role: combo.currentText() for role, combo in self.combos.items() if combo.currentIndex() >= 0}
        chosen = {role: column for role, column in chosen.items() if column and column != NO_COLUMN}
        return chosen if {"user", "assistant"} <= chosen.keys() else None

    def on_choice(self) -> None:
        """Announces a complete mapping."""
        mapping = self.mapping()
        if mapping is not None:
            self.sig_mapping_chosen.emit(mapping)


class DataStep(WizardStep):
    """Chooses the dataset file, checks it off the UI thread, shows the report and prepares the files to upload."""

    step_name = "data"
    title = "Data"
    purpose = (
        "Choose your dataset: conversations or preference pairs (JSONL, CSV or Parquet), or raw text (.txt). It is "
        "checked and prepared on this computer, before any GPU is billing: problems are listed with their line and "
        "how to fix them."
    )

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.check: DatasetCheck | None = None
        self._checked_path = ""
        self._failure: StepProblem | None = None
        self._checking: Running[DatasetCheck] | None = None
        self._answered = True  # the latest check's outcome is shown (its task may still be finishing)
        self.body.addLayout(self._build_picker())
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, PROGRESS_STEPS)
        self.progress_bar.setAccessibleName("Dataset check progress")
        self.progress_bar.hide()
        self.body.addWidget(self.progress_bar)
        self.body.addWidget(self._build_summary())
        self.mapping_box = ColumnMappingBox()
        self.mapping_box.sig_mapping_chosen.connect(self.on_mapping_chosen)
        self.mapping_box.hide()
        self.body.addWidget(self.mapping_box)
        self.body.addWidget(self._build_secrets())
        self.body.addWidget(self._build_tabs(), 1)
        theme_events().sig_changed.connect(self._apply_palette)
        self._apply_palette(current_palette())

    # -- layout ---------------------------------------------------------------------------------------------------

    def _build_picker(self) -> QHBoxLayout:
        row = QHBoxLayout()
        label = QLabel("Dataset &file")
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText(
            "A .jsonl, .csv or .parquet file of conversations or preference pairs, or a .txt of raw text"
        )
        self.path_edit.setAccessibleName("Dataset file path")
        label.setBuddy(self.path_edit)
        self.path_edit.returnPressed.connect(self.on_path_confirmed)
        self.path_edit.editingFinished.connect(self.on_path_entered)
        self.choose_button = plain_button("&Choose file…", "folder-open", "Choose the dataset file")
        self.choose_button.clicked.connect(self.on_choose_clicked)
        row.addWidget(label)
        row.addWidget(self.path_edit, 1)
        row.addWidget(self.choose_button)
        return row

    def _build_summary(self) -> Card:
        self.summary_card = Card()
        self.summary_card.setAccessibleName("Dataset check summary")
        head = QHBoxLayout()
        self.summary_badge = Badge("", "info")
        self.summary_badge.hide()
        self.summary_label = QLabel("No file chosen yet.")
        self.summary_label.setWordWrap(True)
        self.summary_label.setAccessibleName("Dataset check summary")
        font = self.summary_label.font()
        font.setBold(True)
        self.summary_label.setFont(font)
        head.addWidget(self.summary_badge, 0, Qt.AlignmentFlag.AlignTop)
        head.addWidget(self.summary_label, 1)
        self.details_label = QLabel()
        self.details_label.setWordWrap(True)
        self.details_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_label.setAccessibleName("Dataset check details")
        self.details_label.hide()
        self.summary_card.body.addLayout(head)
        self.summary_card.body.addWidget(self.details_label)
        return self.summary_card

    def _build_secrets(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.secrets_banner = Banner("warning")
        self.secrets_check = QCheckBox("&Leave out rows with suspected secrets")
        self.secrets_check.setAccessibleName("Leave out rows with suspected secrets")
        self.secrets_check.toggled.connect(self.on_secrets_toggled)
        layout.addWidget(self.secrets_banner)
        layout.addWidget(self.secrets_check)
        self.secrets_box = box
        box.hide()
        return box

    def _build_tabs(self) -> QTabWidget:
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Dataset report")
        self.tabs.tabBar().setAccessibleName("Dataset report: findings, token lengths or preview")
        self.tabs.setMinimumHeight(REPORT_MIN_HEIGHT)
        self.findings_table = QTableWidget(0, len(_FINDING_COLUMNS))
        self.findings_table.setAccessibleName("Problems found, with their lines and how to fix them")
        self.findings_table.setHorizontalHeaderLabels(_FINDING_COLUMNS)
        self.findings_table.verticalHeader().setVisible(False)
        self.findings_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.findings_table.setWordWrap(True)
        self.findings_table.setTabKeyNavigation(False)
        header = self.findings_table.horizontalHeader()
        for column, mode in enumerate([QHeaderView.ResizeMode.ResizeToContents] * 4 + [QHeaderView.ResizeMode.Stretch]):
            header.setSectionResizeMode(column, mode)
        header.sectionResized.connect(lambda *_: self.findings_table.resizeRowsToContents())
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
        self.histogram_plot = pg.PlotWidget()
        self.histogram_plot.setAccessibleName("Histogram of example lengths in tokens, against the sequence length")
        self.histogram_plot.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        # tall enough for bars, both axes and their titles: squeezed under the report, its axis was cut off
        self.histogram_plot.setMinimumHeight(HISTOGRAM_MIN_HEIGHT)
        self.histogram_plot.getPlotItem().setMenuEnabled(False)
        plot = self.histogram_plot.getPlotItem()
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        self.histogram_bars = pg.BarGraphItem(x0=[], width=[], height=[])
        self.seq_len_line = pg.InfiniteLine(
            angle=90,
            movable=False,
            label="sequence length {value:.0f}",
            labelOpts={"position": 0.9, "anchors": [(1, 0), (1, 0)]},
        )
        plot.addItem(self.histogram_bars)
        plot.addItem(self.seq_len_line)
        self.histogram_caption = QLabel("")
        self.histogram_caption.setWordWrap(True)
        self.histogram_caption.setAccessibleName("Token length statistics")
        layout.addWidget(self.histogram_plot, 1)
        layout.addWidget(self.histogram_caption)
        return box

    def _apply_palette(self, palette: Palette) -> None:
        """Draws the histogram in the theme's colours."""
        self.histogram_plot.setBackground(palette.surface)
        plot = self.histogram_plot.getPlotItem()
        for side, title in (("bottom", "tokens per example"), ("left", "examples")):
            plot.setLabel(side, title, color=palette.text_muted)
            plot.getAxis(side).setTextPen(palette.text_muted)
            plot.getAxis(side).setPen(palette.border)
        self.histogram_bars.setOpts(brush=pg.mkBrush(palette.chart[0]), pen=pg.mkPen(palette.surface))
        self.seq_len_line.setPen(pg.mkPen(palette.danger, width=2))
        self.seq_len_line.label.setColor(palette.text)

    # -- the wizard's interface -----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a check is in progress."""
        return self._checking is not None and self._checking.active and not self._answered

    @property
    def busy(self) -> bool:
        """A check in progress: Enter waits for it instead of warning."""
        return self.running

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
            if not self.running and (self._failure or (self.check is not None and not self.check.usable)):
                self.show_problem(self.step_problem(), focus=False)  # what still blocks Next, shown again
            return
        self.path_edit.setText(path)
        if path:
            self.start_check(path, reuse=self.draft.train_file)
        else:
            self._stop_running()
            self._reset("No file chosen yet.")

    def step_problem(self) -> StepProblem | None:
        """Blocks Next until a usable file has been checked and prepared; says what to do, and where."""
        path = self.path_edit.text().strip()
        if not path:
            return StepProblem(
                "Choose your dataset first",
                "A JSONL, CSV or Parquet file of conversations or of preference pairs (prompt, chosen, rejected), or "
                "a .txt file of raw text: type its path and press Enter, or use Choose file….",
                self.path_edit,
            )
        if path != self._checked_path:
            return StepProblem(
                f"{Path(path).name} is not checked yet", "Press Enter in the file field to check it.", self.path_edit
            )
        if self.running:
            return StepProblem("The dataset is still being checked", "Next works once the check is done.")
        return self._failure or self._result_problem()

    def _result_problem(self) -> StepProblem | None:
        check = self.check
        if check is None:
            return StepProblem(
                "The dataset was not checked", "Press Enter in the file field to check it.", self.path_edit
            )
        if check.usable:
            return None
        headline, details = file_problem(check)
        unmapped = check.fatal_kind == FileProblem.UNKNOWN_LAYOUT.value or (
            check.data_format == DataFormat.COLUMNS.value and check.fatal_kind == FileProblem.NO_USABLE_ROW.value
        )
        field = self.mapping_box.combos["user"] if unmapped and self.mapping_box.isVisibleTo(self) else self.path_edit
        return StepProblem(headline, details, field)

    def save_into(self, draft: RunDraft) -> None:
        """Records the picked file and, when prepared, the files to upload."""
        draft.data_file = self.path_edit.text().strip()
        usable = self.check is not None and self.check.usable and draft.data_file == self._checked_path
        draft.train_file = self.check.train_file if usable and self.check else ""
        draft.eval_file = self.check.eval_file if usable and self.check else ""
        if usable and self.check:
            draft.data_format = self.check.data_format
            draft.fit_objective_to_data()

    async def load(self) -> None:
        """Waits for a check the draft started, so the first screen shows its report."""
        if self._checking is not None:
            await self._checking.wait()

    def focus_field(self, setting: str) -> None:
        """Focuses the file field (``data_file``) or the first column box (``data_columns``)."""
        field = self.mapping_box.combos["user"] if setting == "data_columns" else self.path_edit
        self.scroll_area.ensureWidgetVisible(field)
        field.setFocus(Qt.FocusReason.OtherFocusReason)

    # -- handlers -------------------------------------------------------------------------------------------------

    def on_choose_clicked(self) -> None:
        """Opens a file dialog and checks the file chosen."""
        start = str(Path(self.path_edit.text()).expanduser().parent) if self.path_edit.text() else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a dataset", start, FILE_FILTER)
        if path:
            self.path_edit.setText(path)
            self.start_check(path)

    def on_path_confirmed(self) -> None:
        """Enter in the path field checks a new path, or one whose check failed; a checked file stays checked."""
        path = self.path_edit.text().strip()
        if not path or (path == self._checked_path and (self.running or self._settled())):
            return
        self.start_check(path)

    def _settled(self) -> bool:
        """Whether the file on screen was checked with today's settings and can be used."""
        return self.check is not None and self.check.usable and self._is_current(self._checked_path)

    def on_path_entered(self) -> None:
        """Leaving the path field checks a newly typed path."""
        path = self.path_edit.text().strip()
        if path and path != self._checked_path:
            self.start_check(path)

    def on_mapping_chosen(self, mapping: dict[str, str]) -> None:
        """A new column choice: the file is checked again with it."""
        self.draft.data_columns = dict(mapping)
        if self._checked_path:
            self.start_check(self._checked_path)

    def on_secrets_toggled(self, leave_out: bool) -> None:
        """Leaving secrets out (or back in) prepares the data again."""
        if leave_out == self.draft.leave_out_secrets:
            return
        self.draft.leave_out_secrets = leave_out
        if self._checked_path:
            self.start_check(self._checked_path)

    # -- checking -------------------------------------------------------------------------------------------------

    def _is_current(self, path: str) -> bool:
        """Whether what is shown (or being checked) already answers for ``path`` with today's settings."""
        if not path or path != self._checked_path:
            return False
        if self.running or self._failure:
            return True
        return self.check is not None and self.check.answers(**draft_settings(self.draft))

    def start_check(self, path: str, *, reuse: str = "") -> None:
        """Checks and prepares ``path`` off the UI thread, cancelling a check still running.

        Args:
            path: The dataset file.
            reuse: A prepared training file whose remembered report may be shown instead, if still valid.
        """
        self._stop_running()
        self._answered = False
        if path != self.draft.data_file:
            self.draft.data_columns = {}  # a column mapping belongs to the file it was chosen for
        self._checked_path = path
        self.draft.data_file, self.draft.train_file, self.draft.eval_file = path, "", ""
        self._reset(f"Checking {Path(path).name}…")
        self.progress_bar.setValue(0)
        self.progress_bar.show()
        snapshot = self.draft.model_copy(deep=True)
        snapshot.train_file = reuse
        _log.info("checking %s with %s", path, draft_settings(snapshot))
        self._checking = (
            Operation(self, lambda job: _check(snapshot, job), self._show_check, group="check")
            .with_progress(self._on_progress)
            .failure(lambda exc: self._show_failure(path, exc), OSError, PrepareError)
            .failure(self._show_unexpected)
            .run()
        )
        self.sig_changed.emit()

    def _show_unexpected(self, exc: Exception) -> None:
        """Says the check broke, then sends the error on to the app's error reporter."""
        self._answered = True
        self._failure = StepProblem(
            "The check stopped unexpectedly",
            "Press Enter in the file field to try again; the log has the details.",
            self.path_edit,
        )
        self._show_failed(self._failure)
        raise exc

    def _stop_running(self) -> None:
        if self._checking is not None and self._checking.active:
            _log.info("cancelling the check of %s", self._checked_path)
            self._checking.cancel()

    def _on_progress(self, fraction: float) -> None:
        self.progress_bar.setValue(round(fraction * PROGRESS_STEPS))

    def _show_failure(self, path: str, exc: OSError | PrepareError) -> None:
        _log.warning("checking %s failed: %s", path, exc)
        self._answered = True
        name = Path(path).name
        if isinstance(exc, OSError):
            self._failure = StepProblem(
                f"{name} could not be read",
                f"{exc.strerror or 'The system refused it'}. Check that the file exists and that you may read it, "
                "then press Enter in the file field.",
                self.path_edit,
            )
        else:
            self._failure = StepProblem(
                f"{name} could not be prepared",
                f"{str(exc).removeprefix(f'{path}: ')}. Fix the file, then press Enter in the file field.",
                self.path_edit,
            )
        self._show_failed(self._failure)

    def _show_failed(self, problem: StepProblem) -> None:
        self.progress_bar.hide()
        self.summary_badge.show_state("Cannot be used", "danger")
        self.summary_badge.setToolTip("")
        self.summary_badge.show()
        self.summary_label.setText(problem.headline)
        self.details_label.clear()
        self.details_label.hide()  # the banner above says what to do
        self.show_problem(problem, focus=False)
        self.sig_changed.emit()

    # -- showing the report ---------------------------------------------------------------------------------------

    def _reset(self, message: str) -> None:
        self.check = None
        self._failure = None
        self.show_problem(None)
        self.progress_bar.hide()
        self.summary_badge.hide()
        self.summary_label.setText(message)
        self.details_label.clear()
        self.details_label.hide()
        self.findings_table.setRowCount(0)
        self.tabs.setTabText(0, "Fin&dings")
        self.histogram_bars.setOpts(x0=[], width=[], height=[])
        self.seq_len_line.setValue(int(draft_settings(self.draft)["seq_len"]))
        self.histogram_caption.clear()
        self.preview_text.clear()

    def _show_check(self, check: DatasetCheck) -> None:
        _log.info("%s: %s", check.source, "usable" if check.usable else f"unusable ({check.fatal})")
        self._answered = True
        self.check = check
        self.progress_bar.hide()
        shown = summary(check)
        self.summary_badge.show_state(shown.badge, shown.severity)
        self.summary_badge.setToolTip(shown.badge_tip)
        self.summary_badge.show()
        self.summary_label.setText(shown.headline)
        self.details_label.setText("\n".join(shown.details))
        self.details_label.setVisible(bool(shown.details) and check.usable)  # else the banner above says it
        self._show_mapping(check)
        self._show_secrets(check)
        self._show_findings(check.report.get("findings", []))
        self._show_histogram(check)
        self.preview_text.setPlainText(format_preview(check.preview) or "No example could be kept to show.")
        if check.usable:
            self.save_into(self.draft)
        else:
            self.show_problem(self.step_problem(), focus=False)
        self.sig_changed.emit()

    def _show_mapping(self, check: DatasetCheck) -> None:
        self.mapping_box.setVisible(shows_mapping(check))
        if shows_mapping(check):
            self.mapping_box.show_columns(check.fields, check.mapping or check.columns)

    def _show_secrets(self, check: DatasetCheck) -> None:
        rows = check.secret_rows
        self.secrets_box.setVisible(rows > 0)
        if not rows:
            return
        kept = not check.leave_out_secrets
        self.secrets_banner.show_message(
            "warning" if kept else "info",
            f"{counted(rows, 'row')} {'seems' if rows == 1 else 'seem'} to hold a secret"
            + (": kept in the training data" if kept else ": left out of the training data"),
            "An API key, token or private key. A model can learn a secret and repeat it to anyone who asks. "
            "Leave such rows out, or remove the secrets from the file and check it again.",
        )
        self.secrets_check.blockSignals(True)
        self.secrets_check.setChecked(check.leave_out_secrets)
        self.secrets_check.blockSignals(False)

    def _show_findings(self, findings: list[dict[str, Any]]) -> None:
        table = self.findings_table
        table.setRowCount(len(findings))
        for row, finding in enumerate(findings):
            words, severity = _SEVERITY_BADGES[finding["severity"]]
            holder = QWidget()
            layout = QHBoxLayout(holder)
            layout.setContentsMargins(6, 2, 6, 2)
            layout.addWidget(Badge(words, severity))
            table.setCellWidget(row, 0, holder)
            severity_item = QTableWidgetItem()  # the badge shows the words; the item keeps them for sorting and tests
            severity_item.setData(Qt.ItemDataRole.UserRole, words)
            severity_item.setToolTip(words)
            table.setItem(row, 0, severity_item)
            problem = "\n".join([finding["title"][:1].upper() + finding["title"][1:], *finding["details"]])
            cells = [problem, f"{finding['count']:,}", lines_text(finding), fix_words(finding)]
            for column, text in enumerate(cells, start=1):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                table.setItem(row, column, item)
        table.resizeRowsToContents()
        # the tab counts what it lists (kinds of problem); the rows they touch are in each line's Rows column
        rows = sum(f["count"] for f in findings)
        self.tabs.setTabText(0, f"Fin&dings ({len(findings):,})")
        self.tabs.setTabToolTip(0, f"{counted(len(findings), 'kind')} of problem, in {counted(rows, 'row')}")

    def _show_histogram(self, check: DatasetCheck) -> None:
        bars = check.histogram
        self.histogram_bars.setOpts(
            x0=[bar.start for bar in bars], width=[bar.width for bar in bars], height=[bar.count for bar in bars]
        )
        self.seq_len_line.setValue(check.seq_len)
        self.histogram_caption.setText(histogram_caption(check.numbers, check.data_format))


def _check(draft: RunDraft, job: Job) -> DatasetCheck:
    """The draft's dataset checked and prepared for its settings (blocking; stops when cancelled).

    Raises:
        CheckCancelledError: The job was cancelled (a newer check started).
    """
    check = prepare_for_draft(draft, progress=job.report, cancel=job.cancel)
    assert check is not None  # the draft names a file
    return check
