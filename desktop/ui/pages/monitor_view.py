"""The monitor's layout, built from the design system's blocks: it shows what it is given and decides nothing.

Header (title, state badge, caption), a banner, the progress card (phase chips, progress line), the loss chart beside
the training and machine cards, the log, and the actions, which stay in reach below the scrolled part.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from desktop.core.runs.progress import RewardPoint
from desktop.ui.design.palette import METRICS
from desktop.ui.pages.monitor_text import (
    MACHINE_ROWS,
    OPTIONAL_MACHINE_ROWS,
    OPTIONAL_TRAINING_ROWS,
    TRAINING_ROWS,
    Busy,
    Notice,
)
from desktop.ui.widgets.blocks import (
    Badge,
    Banner,
    Card,
    caption,
    destructive_button,
    heading,
    plain_button,
    primary_button,
)
from desktop.ui.widgets.loss_chart import LossChart
from desktop.ui.widgets.phase_timeline import PhaseTimeline
from desktop.ui.widgets.preference_chart import PreferenceChart

#: Lines the log keeps (older ones scroll away).
LOG_LINES = 500


class MonitorView(QWidget):
    """The monitor's widgets; the page fills them with :meth:`show_header`, :meth:`show_rows` and the others."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(METRICS.gap // 2)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self._build_content())
        outer.addWidget(scroll, 1)
        outer.addLayout(self._build_actions())  # outside the scrolled part: always in reach
        self._log_lines: list[str] = []

    # -- building ------------------------------------------------------------------------------------------------

    def _build_content(self) -> QWidget:
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 6, 0)
        layout.setSpacing(METRICS.gap)
        layout.addLayout(self._build_header())
        self.banner = Banner()
        self.copy_address_button = plain_button(
            "&Copy address", "copy", "Copy the served model's OpenAI-compatible address to the clipboard"
        )
        self.copy_address_button.hide()  # only while the machine serves the tuned model
        self.banner.add_action(self.copy_address_button)
        layout.addWidget(self.banner)
        layout.addWidget(self._build_progress())
        middle = QHBoxLayout()
        middle.setSpacing(METRICS.gap)
        self.chart_card = chart_card = Card("Loss")
        self.chart = LossChart()
        chart_card.body.addWidget(self.chart, 1)
        self.preference_chart = PreferenceChart()
        self.preference_chart.hide()  # a preference run's (DPO, ORPO) only, once its trainer logs rewards
        chart_card.body.addWidget(self.preference_chart, 1)
        middle.addWidget(chart_card, 3)
        training, self.stats, self._row_names = _rows_card("Training", TRAINING_ROWS, columns=1)
        middle.addWidget(training, 2)
        layout.addLayout(middle)
        machine, self.machine, machine_names = _rows_card("Machine and cost", MACHINE_ROWS, columns=2)
        self._row_names.update({key: machine_names[key] for key in OPTIONAL_MACHINE_ROWS})
        layout.addWidget(machine)
        self.nodes_card = Card("Machines of this run", "It trains on several machines as one; rank 0 reports.")
        self.nodes_label = QLabel()
        self.nodes_label.setAccessibleName("Machines of this run")
        self.nodes_label.setWordWrap(True)
        self.nodes_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.nodes_card.body.addWidget(self.nodes_label)
        self.nodes_card.hide()
        layout.addWidget(self.nodes_card)
        layout.addWidget(self._build_log(), 1)
        return content

    def _build_header(self) -> QVBoxLayout:
        column = QVBoxLayout()
        column.setSpacing(2)
        row = QHBoxLayout()
        self.title_label = heading("")
        self.title_label.setWordWrap(True)
        self.title_label.setAccessibleName("Run")
        self.badge = Badge("", "info")
        row.addWidget(self.title_label, 1)
        row.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignTop)
        column.addLayout(row)
        self.subtitle_label = caption()
        self.subtitle_label.setAccessibleName("About the run")
        column.addWidget(self.subtitle_label)
        return column

    def _build_progress(self) -> Card:
        card = Card("Progress")
        self.timeline = PhaseTimeline()
        card.body.addWidget(self.timeline)
        self.busy_bar = QProgressBar()
        self.busy_bar.setAccessibleName("Run progress")
        self.busy_bar.setTextVisible(True)
        card.body.addWidget(self.busy_bar)
        return card

    def _build_log(self) -> Card:
        card = Card("Log", "The run's history: phases, checkpoints, machines and what went wrong.")
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(LOG_LINES)
        self.log_view.setMinimumHeight(150)
        self.log_view.setAccessibleName("Run log")
        self.log_view.setPlaceholderText("The run's history appears here.")
        self._log_follows = True  # the newest lines stay in view, until the reader scrolls up to older ones
        bar = self.log_view.verticalScrollBar()
        bar.rangeChanged.connect(self._on_log_range_changed)
        bar.actionTriggered.connect(lambda _action: QTimer.singleShot(0, self._on_log_scrolled))  # the reader's own
        card.body.addWidget(self.log_view)
        return card

    def _on_log_range_changed(self, _low: int, high: int) -> None:
        if self._log_follows:
            self.log_view.verticalScrollBar().setValue(high)

    def _on_log_scrolled(self) -> None:
        bar = self.log_view.verticalScrollBar()
        self._log_follows = bar.value() >= bar.maximum() - 2

    def _build_actions(self) -> QVBoxLayout:
        column = QVBoxLayout()
        column.setSpacing(4)
        self.action_label = caption()
        self.action_label.setAccessibleName("Action status")
        column.addWidget(self.action_label)
        row = QHBoxLayout()
        self.stop_button = destructive_button("&Stop…", "circle-stop", "Stop the run, keeping a checkpoint")
        self.pull_button = plain_button("&Pull checkpoint", "download", "Bring the newest checkpoint home now")
        self.resume_button = primary_button("&Resume", "play", "Resume the run from its newest checkpoint")
        self.move_button = plain_button("Resume &elsewhere…", "server", "Continue the run on another server")
        self.folder_button = plain_button("Open &folder", "folder-open", "Open the run's folder")
        self.models_button = plain_button(
            "E&xport or chat…", "boxes", "Export, compare or chat with the run's adapter or newest checkpoint"
        )
        self.tensorboard_button = plain_button(
            "&TensorBoard", "chart-column", "Open the run's TensorBoard event files in a TensorBoard on this computer"
        )
        self.trackio_button = plain_button(
            "Trac&kio", "activity", "Open the run's trackio database in trackio's dashboard on this computer"
        )
        # Shown for a run with [tracking] report_to tensorboard or trackio, once its logs are home.
        self.tensorboard_button.hide()
        self.trackio_button.hide()
        buttons = (
            self.resume_button,
            self.pull_button,
            self.move_button,
            self.models_button,
            self.tensorboard_button,
            self.trackio_button,
            self.folder_button,
        )
        for button in buttons:
            row.addWidget(button)
        row.addStretch(1)
        row.addWidget(self.stop_button)
        column.addLayout(row)
        return column

    # -- showing -------------------------------------------------------------------------------------------------

    def clear(self, title: str) -> None:
        """Forgets what was shown (another run comes): readings, chart, chips, log."""
        self.show_header(title, "Reading the run…", "Reading…", "info")
        self.banner.show_message("info", "")
        self.timeline.show_items([])
        self.show_busy(Busy("Reading the run…"))
        self.chart.clear()
        for rows in (self.stats, self.machine):
            for label in rows.values():
                label.setText("—")
        self.show_log([])

    def show_header(self, title: str, subtitle: str, state: str, severity: str) -> None:
        """The run's title, the line under it and its state badge."""
        if self.title_label.text() != title:
            self.title_label.setText(title)
        if self.subtitle_label.text() != subtitle:
            self.subtitle_label.setText(subtitle)
        if self.badge.text() != state or self.badge.property("severity") != severity:
            self.badge.show_state(state, severity)

    def show_notice(self, notice: Notice | None) -> None:
        """The banner (hidden without a notice)."""
        banner = self.banner
        if notice is None:
            if not banner.isHidden():
                banner.show_message("info", "")
            return
        shown = (banner.property("severity"), banner.headline_label.text(), banner.details_label.text())
        if banner.isHidden() or shown != (notice.severity, notice.headline, notice.details):
            banner.show_message(notice.severity, notice.headline, notice.details)

    def show_busy(self, busy: Busy) -> None:
        """The progress line: a measure when there is one, else a busy bar (a full one for a finished run)."""
        bar = self.busy_bar
        if (bar.maximum(), bar.value(), bar.format()) == (busy.maximum, busy.value, busy.text):
            return
        bar.setRange(0, busy.maximum)
        bar.setValue(busy.value)
        bar.setFormat(busy.text)  # no %p, %v or %m in it: Qt shows it as it is
        bar.setAccessibleDescription(busy.text)

    def show_rows(self, labels: dict[str, QLabel], texts: dict[str, str]) -> None:
        """Sets the rows of a card whose text changed; an optional row without text is hidden, name and all."""
        for key, text in texts.items():
            label = labels[key]
            if label.text() != text:
                label.setText(text)
            optional = OPTIONAL_TRAINING_ROWS if labels is self.stats else OPTIONAL_MACHINE_ROWS
            if key in optional:
                label.setVisible(bool(text))
                self._row_names[key].setVisible(bool(text))

    def show_preference(self, rewards: Sequence[RewardPoint], eval_rewards: Sequence[RewardPoint], total: int) -> None:
        """The preference chart under the loss chart, once a preference run logged rewards (hidden otherwise)."""
        shown = bool(rewards or eval_rewards)
        title = "Loss and preference" if shown else "Loss"
        if self.chart_card.title_label is not None and self.chart_card.title_label.text() != title:
            self.chart_card.title_label.setText(title)
            self.chart_card.setAccessibleName(title)
        self.preference_chart.setVisible(shown)
        if shown:
            self.preference_chart.show_points(rewards, eval_rewards, total)

    def show_nodes(self, lines: Sequence[str]) -> None:
        """One line per machine of a run across several (the card is hidden for a run on one machine)."""
        text = "\n".join(lines)
        if self.nodes_label.text() != text:
            self.nodes_label.setText(text)
        self.nodes_card.setVisible(bool(lines))

    def show_log(self, lines: Sequence[str]) -> None:
        """Shows the log: appended to when only new lines came, rewritten when the history changed."""
        lines = list(lines)
        if lines == self._log_lines:
            return
        old = self._log_lines
        if old and lines[: len(old)] == old:
            for line in lines[len(old) :]:
                self.log_view.appendPlainText(line)
        else:
            self._log_follows = True  # another run, or its history read anew: its newest lines first
            self.log_view.setPlainText("\n".join(lines))
            self.log_view.moveCursor(QTextCursor.MoveOperation.End)
        self._log_lines = lines


def _rows_card(
    title: str, rows: Sequence[tuple[str, str]], columns: int
) -> tuple[Card, dict[str, QLabel], dict[str, QLabel]]:
    """A card of label/value rows in ``columns`` pairs of columns; the values wrap and can be selected (paths).

    Returns the card, each row's value label and each row's name label.
    """
    card = Card(title)
    grid = QGridLayout()
    grid.setHorizontalSpacing(12)
    grid.setVerticalSpacing(6)
    labels: dict[str, QLabel] = {}
    names: dict[str, QLabel] = {}
    for index, (key, text) in enumerate(rows):
        row, column = divmod(index, columns)
        value = QLabel("—")
        value.setAccessibleName(text)
        value.setWordWrap(True)
        value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        value.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        name = caption(text)
        name.setWordWrap(False)
        if key in OPTIONAL_TRAINING_ROWS:  # hidden, name and all, while it has nothing to say
            value.hide()
            name.hide()
        name.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        grid.addWidget(name, row, 2 * column, Qt.AlignmentFlag.AlignTop)
        grid.addWidget(value, row, 2 * column + 1, Qt.AlignmentFlag.AlignTop)
        labels[key], names[key] = value, name
    for column in range(columns):
        grid.setColumnStretch(2 * column + 1, 1)
    card.body.addLayout(grid)
    card.body.addStretch(1)
    return card, labels, names
