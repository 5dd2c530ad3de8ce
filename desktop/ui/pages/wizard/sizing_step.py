"""The wizard's sizing step: peak memory per GPU, itemised, and the GPU options ranked by cost to finish.

The planner is the one behind ``rentune plan``; the token count comes from the prepared data's manifest, so the
hours and dollars shown are for the data that will really be uploaded.
"""

from __future__ import annotations

import json

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QSignalBlocker, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QPalette
from PySide6.QtWidgets import (
    QGroupBox,
    QLabel,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.core.runs.draft import RunDraft
from desktop.core.sizing.plan import GpuOption
from desktop.core.sizing.report import format_hours
from desktop.services.models.sizing import Sizing, SizingError, option_label, server_fit_warning
from desktop.services.runs.drafts import size_draft
from desktop.ui.background import Operation, Running
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.sizing_words import change_words, fit_text
from desktop.ui.pages.wizard.step_base import WizardStep
from desktop.ui.widgets.charts import plot_filling
from desktop.ui.widgets.tables import pick_one_table

#: Common card sizes drawn as lines across the memory bar (GB).
CARD_SIZES_GB = (24, 48, 80, 141)
ITEM_LABELS = {
    "weights": "Base weights",
    "lora_adapter": "LoRA adapter, its gradients and AdamW",
    "gradients": "Gradients",
    "optimizer": "Optimizer states",
    "activations": "Activations",
    "logits": "Logits and loss",
    "fsdp_buffers": "FSDP buffers",
    "allocator_overhead": "Allocator overhead",
    "cuda_context": "CUDA context",
}
ITEM_COLOURS = ("#3b82f6", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#ec4899", "#14b8a6", "#64748b", "#a3a3a3")
RECOMMENDED_COLOUR = QColor(16, 185, 129, 70)


def _sizing_key(draft: RunDraft) -> str:
    """What the sizing depends on; a new plan is made only when it changes."""
    return json.dumps([draft.base_model, draft.method, draft.training, draft.train_file], sort_keys=True, default=str)


def _chart_limit(total: float) -> float:
    """The chart's width: the bar and the next two card sizes (so the card it fits and the one above show)."""
    larger = [size for size in CARD_SIZES_GB if size >= total * 1.02]
    return max(total, *larger[:2]) * 1.05 if larger else total * 1.08


class MemoryChart(QWidget):
    """Peak memory per GPU as one stacked horizontal bar, with lines at common card sizes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Memory per GPU chart: one bar stacked by item, lines at 24, 48, 80 and 141 GB")
        self.setMinimumHeight(120)
        self.setMaximumHeight(180)
        self.plot_widget = plot_filling(self)
        plot = self.plot_widget.getPlotItem()
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        plot.hideAxis("left")
        plot.setLabel("bottom", "GB per GPU")
        self.items: dict[str, float] = {}
        self.segments: list[pg.BarGraphItem] = []
        self.card_lines: list[pg.InfiniteLine] = []
        self._apply_palette()

    def show_items(self, items: dict[str, float]) -> None:
        """Draws the non-zero items left to right, in order, and the card-size lines."""
        plot = self.plot_widget.getPlotItem()
        plot.clear()
        self.items, self.segments, self.card_lines, start = dict(items), [], [], 0.0
        for index, value in enumerate(v for v in items.values() if v > 0):
            colour = ITEM_COLOURS[index % len(ITEM_COLOURS)]
            bar = pg.BarGraphItem(x0=[start], y=[0.0], width=[value], height=0.6, brush=colour, pen=None)
            plot.addItem(bar)
            self.segments.append(bar)
            start += value
        text = self.palette().color(QPalette.ColorRole.Text)
        for size in CARD_SIZES_GB:
            pen = pg.mkPen(text, style=Qt.PenStyle.DashLine)
            line = pg.InfiniteLine(pos=size, angle=90, pen=pen, label=f"{size} GB")
            line.label.setColor(text)
            line.label.setPosition(0.9)
            plot.addItem(line)
            self.card_lines.append(line)
        plot.setXRange(0, _chart_limit(start), padding=0)
        plot.setYRange(-0.6, 0.6, padding=0)

    def clear(self) -> None:
        """Removes the bar and the lines (nothing to show)."""
        self.plot_widget.getPlotItem().clear()
        self.items, self.segments, self.card_lines = {}, [], []

    def total(self) -> float:
        """The length of the stacked bar (GB)."""
        return sum(float(bar.opts["width"][0]) for bar in self.segments)

    def changeEvent(self, event: QEvent) -> None:
        """Follows light/dark switches."""
        super().changeEvent(event)
        if event.type() in {QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange}:
            self._apply_palette()
            if self.items:
                self.show_items(self.items)

    def _apply_palette(self) -> None:
        palette = self.palette()
        self.plot_widget.setBackground(palette.color(QPalette.ColorRole.Base))
        axis = self.plot_widget.getPlotItem().getAxis("bottom")
        axis.setPen(palette.color(QPalette.ColorRole.Text))
        axis.setTextPen(palette.color(QPalette.ColorRole.Text))


class SizingStep(WizardStep):
    """Shows what the job needs and which GPUs fit it; the row the user selects becomes ``draft.gpu_name``."""

    step_name = "sizing"
    title = "Sizing"
    purpose = (
        "What the job needs before you rent anything: peak memory per GPU, item by item, and every GPU option "
        "ranked by the cost to finish. Select the option you plan to use."
    )

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.sizing: Sizing | None = None
        self.problem: str | None = None
        self._key: str | None = None
        self.status_label = QLabel("Choose a model on the Model step to size the job.")
        self.status_label.setObjectName("sizing_status")
        self.status_label.setWordWrap(True)
        self.status_label.setAccessibleName("Sizing status")
        self.body.addWidget(self.status_label)
        self.body.addWidget(self._build_memory())
        self.body.addWidget(self._build_options(), 1)

    def _build_memory(self) -> QGroupBox:
        box = QGroupBox("Peak memory per GPU")
        layout = QVBoxLayout(box)
        self.chart = MemoryChart()
        self.items_label = QLabel()
        self.items_label.setTextFormat(Qt.TextFormat.RichText)
        self.items_label.setWordWrap(True)
        self.items_label.setAccessibleName("Memory items in GB")
        layout.addWidget(self.chart)
        layout.addWidget(self.items_label)
        return box

    def _build_options(self) -> QGroupBox:
        box = QGroupBox("GPU options, cheapest that fits first")
        layout = QVBoxLayout(box)
        self.recommendation_label = QLabel()
        self.recommendation_label.setWordWrap(True)
        self.recommendation_label.setAccessibleName("Recommended GPU")
        self.options_table = pick_one_table(
            ["GPU", "Count", "Fits", "Hours", "Dollars"],
            "GPU options: select the one you plan to use",
            stretch_column=2,
        )
        self.options_table.itemSelectionChanged.connect(self.on_option_selected)
        self.suggestions_label = QLabel()
        self.suggestions_label.setWordWrap(True)
        self.suggestions_label.setAccessibleName("What to change so the job fits")
        self.server_label = QLabel()
        self.server_label.setObjectName("sizing_server_warning")
        self.server_label.setWordWrap(True)
        self.server_label.setAccessibleName("Does the job fit your own server")
        for widget in (self.recommendation_label, self.options_table, self.suggestions_label, self.server_label):
            layout.addWidget(widget, 1 if widget is self.options_table else 0)
        return box

    # -- the wizard's hooks ---------------------------------------------------------------------------------------

    def show_draft(self) -> None:
        """Sizes the job again when the model, method, settings or data changed since the last time."""
        if _sizing_key(self.draft) != self._key:
            self._start_sizing()
        elif self.sizing is not None:
            self._show_server_fit(self.sizing)

    def validate(self) -> str | None:
        """Blocks only when the job cannot be sized at all; a job too big for every GPU is shown, not blocked."""
        return self.problem

    def save_into(self, draft: RunDraft) -> None:
        """Nothing to copy: a row the user selects is written to ``draft.gpu_name`` at once (on_option_selected).

        The pre-selected recommendation is not written, so a later re-plan (another model, more data) recommends
        afresh instead of holding on to an old automatic choice.
        """

    async def load(self) -> None:
        """Sizes the saved draft once when the window opens (a Hub model may need the network)."""
        if self.draft.base_model and _sizing_key(self.draft) != self._key:
            await self.refresh()

    # -- sizing ------------------------------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Makes a new plan for the draft off the UI thread and shows it (a newer refresh wins)."""
        await self._start_sizing().wait()

    def _start_sizing(self) -> Running[Sizing]:
        """Starts sizing a copy of the draft; an older sizing still running is dropped."""
        key, snapshot, secrets = _sizing_key(self.draft), self.draft.model_copy(deep=True), self.context.secrets
        self.status_label.setText(f"Sizing {snapshot.base_model or 'the job'}…")
        return (
            Operation(self, lambda _job: size_draft(snapshot, secrets), lambda s: self._sized(key, s), group="sizing")
            .failure(lambda exc: self._sized(key, exc), SizingError)
            .run()
        )

    def _sized(self, key: str, outcome: Sizing | SizingError) -> None:
        self._key = key
        if isinstance(outcome, SizingError):
            self._show_problem(_sentence(str(outcome)))
        else:
            self._show_sizing(outcome)

    def _show_problem(self, message: str) -> None:
        self.sizing, self.problem = None, message
        self.status_label.setText(message)
        self.chart.clear()
        for label in (self.items_label, self.recommendation_label, self.suggestions_label, self.server_label):
            label.clear()
        self.options_table.setRowCount(0)
        self.sig_changed.emit()

    def _show_sizing(self, sizing: Sizing) -> None:
        self.sizing, self.problem = sizing, None
        plan = sizing.plan
        self.status_label.setText(_plan_summary(sizing))
        self.chart.show_items(plan.memory.items)
        self.items_label.setText(_items_html(plan.memory.items, plan.memory.per_gpu_total))
        self._fill_table(sizing)
        self.suggestions_label.setText(_suggestions_text(sizing))
        self.suggestions_label.setVisible(bool(self.suggestions_label.text()))
        self._show_server_fit(sizing)
        self._select(self.draft.gpu_name, sizing)
        self.sig_changed.emit()

    def _fill_table(self, sizing: Sizing) -> None:
        table, recommended = self.options_table, sizing.recommended
        table.blockSignals(True)
        table.clearSelection()
        table.setRowCount(len(sizing.plan.options))
        for row, option in enumerate(sizing.plan.options):
            name = option.gpu.name + (f" ({option.strategy.value})" if option.count > 1 else "")
            cells = [name, str(option.count), fit_text(option), format_hours(option.hours), f"${option.cost_usd:,.2f}"]
            if option is recommended:
                cells[0] += " (recommended)"
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, option_label(option))
                if column in (1, 3, 4):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if option is recommended:
                    font = QFont(item.font())
                    font.setBold(True)
                    item.setFont(font)
                    item.setBackground(QBrush(RECOMMENDED_COLOUR))
                table.setItem(row, column, item)
        table.blockSignals(False)
        self.recommendation_label.setText(_recommendation_text(recommended))

    def _select(self, label: str, sizing: Sizing) -> None:
        """Selects the draft's pick when it is still an option, else the recommendation."""
        labels = [option_label(o) for o in sizing.plan.options]
        recommended = sizing.recommended
        wanted = label if label in labels else (option_label(recommended) if recommended else None)
        if wanted is None:
            self.draft.gpu_name = ""
            return
        # A pre-selection is not the user's pick: it reaches the draft only when they move on (save_into).
        with QSignalBlocker(self.options_table.selectionModel()):
            self.options_table.selectRow(labels.index(wanted))

    def _selected_label(self) -> str | None:
        rows = self.options_table.selectionModel().selectedRows()
        item = self.options_table.item(rows[0].row(), 0) if rows else None
        return str(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None

    def on_option_selected(self) -> None:
        """Records the selected option as the draft's GPU pick."""
        label = self._selected_label()
        if label is not None and label != self.draft.gpu_name:
            self.draft.gpu_name = label
            self.sig_changed.emit()

    def _show_server_fit(self, sizing: Sizing) -> None:
        """Warns (without blocking) when the tested own server's GPU is too small for the job."""
        self.server_label.setText(server_fit_warning(self.draft.target.gpu, sizing))
        self.server_label.setVisible(bool(self.server_label.text()))


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "."


def _plan_summary(sizing: Sizing) -> str:
    plan, setup = sizing.plan, sizing.plan.setup
    trainable = f"{plan.trainable_params / 1e6:,.1f} M trainable" if setup.method.is_peft else "all trainable"
    return (
        f"{plan.arch.name}: {plan.arch.total_params / 1e9:.2f} B parameters, {trainable} ({setup.method.value}); "
        f"{plan.workload.tokens:,} tokens x {plan.workload.epochs:g} epochs ({sizing.tokens_source})."
    )


def _items_html(items: dict[str, float], total: float) -> str:
    shown = [(name, value) for name, value in items.items() if value > 0]
    parts = [
        f'<span style="color:{ITEM_COLOURS[i % len(ITEM_COLOURS)]}">&#9632;</span> {ITEM_LABELS.get(name, name)} '
        f"{value:.2f} GB"
        for i, (name, value) in enumerate(shown)
    ]
    return "&nbsp;&nbsp; ".join(parts) + f"<br><b>Total: {total:.2f} GB per GPU</b>"


def _recommendation_text(option: GpuOption | None) -> str:
    if option is None:
        return "Nothing fits as configured: see the changes below."
    return (
        f"Recommended: {option_label(option)}, {fit_text(option)}, about {format_hours(option.hours)} and "
        f"${option.cost_usd:,.2f} at list price."
    )


def _suggestions_text(sizing: Sizing) -> str:
    if sizing.recommended is not None:
        return ""
    if not sizing.plan.suggestions:
        return "Nothing fits any GPU even with smaller settings: choose a smaller model, or QLoRA, on the Model step."
    lines = ["Changes that make it fit (on the Model step):"]
    for suggestion in sizing.plan.suggestions:
        option = suggestion.option
        changes = ", ".join(change_words(change) for change in suggestion.changes)
        lines.append(
            f"• {changes}: {option_label(option)}, {option.memory.per_gpu_total:.1f} GB per GPU, "
            f"{format_hours(option.hours)}, ${option.cost_usd:,.2f}"
        )
    return "\n".join(lines)
