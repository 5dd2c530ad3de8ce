"""The wizard's sizing step: peak memory per GPU, itemised, and the GPU options ranked by cost to finish.

The planner is the one behind ``rentune plan``. The numbers come from
:func:`desktop.services.runs.draft_facts.draft_facts`: when the model, the sequence length or the data settings
changed since the data was prepared, it is prepared again (tokens counted with the chosen model's tokenizer), so
the tokens, hours and dollars shown are for the data that will really be uploaded, the same the Data step shows.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QTableWidgetItem,
    QWidget,
)

from desktop.core.runs.draft import RunDraft
from desktop.core.sizing.plan import GpuOption
from desktop.core.sizing.report import format_hours
from desktop.core.units import count_text, memory_text
from desktop.services.data.numbers import DataNumbers
from desktop.services.models.sizing import SETTING_LABELS, Sizing, option_label, server_fit_warning
from desktop.services.models.sizing_words import (
    change_words,
    fit_severity,
    fit_text,
    method_words,
    option_words,
    split_words,
)
from desktop.services.runs.draft_facts import DraftFacts, draft_facts
from desktop.ui.background import Operation, Running
from desktop.ui.context import AppContext
from desktop.ui.design.palette import Palette
from desktop.ui.pages.wizard.data_words import counting_words, model_words
from desktop.ui.pages.wizard.step_base import StepProblem, WizardStep
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.blocks import Badge, Banner, Card, caption, plain_button
from desktop.ui.widgets.charts import BarSegment, Capacity, MemoryBarChart, swatch
from desktop.ui.widgets.tables import pick_one_table

#: Common card sizes drawn as lines across the memory bar (GiB, as cards are sold).
CARD_SIZES_GIB = (24, 48, 80, 141)
ITEM_LABELS = {
    "weights": "Base weights",
    "reference_model": "DPO reference model",
    "lora_adapter": "LoRA adapter, its gradients and AdamW",
    "gradients": "Gradients",
    "optimizer": "Optimizer states",
    "activations": "Activations",
    "logits": "Logits and loss",
    "fsdp_buffers": "FSDP buffers",
    "allocator_overhead": "Allocator overhead",
    "cuda_context": "CUDA context",
}
#: Each memory component's place in the palette's chart colours, whatever else is shown. The LoRA adapter and the
#: full gradients never appear together; the CUDA context is the allocator's colour, hatched.
COMPONENT_COLOURS = {
    "weights": 0,
    "reference_model": 0,
    "lora_adapter": 1,
    "gradients": 1,
    "activations": 2,
    "logits": 3,
    "optimizer": 4,
    "fsdp_buffers": 5,
    "allocator_overhead": 6,
    "cuda_context": 6,
}
HATCHED = {"cuda_context"}
OPTION_COLUMNS = ["GPU", "GPUs", "Fits", "Time", "Cost"]
LEGEND_COLUMNS = 3
TABLE_MIN_HEIGHT = 200
_STEP_OF_SETTING = {"base_model": "model", **dict.fromkeys(SETTING_LABELS, "model"), "method": "model"}


def _sizing_key(draft: RunDraft) -> str:
    """What the sizing depends on; a new plan is made only when it changes."""
    parts: list[object] = [draft.base_model, draft.method, draft.training, draft.data_file, draft.train_file]
    parts += [draft.data_columns, draft.leave_out_secrets]
    return json.dumps(parts, sort_keys=True, default=str)


def memory_segments(items: dict[str, float], palette: Palette) -> list[BarSegment]:
    """The memory items as bar segments, each in its component's colour.

    A correction measured on the user's runs (``measured``) scales the model's items to the measured total, so the
    bar adds up to it (the CUDA context, outside the measurement, stays as it is).
    """
    items = measured_items(items)
    return [
        BarSegment(
            name,
            ITEM_LABELS.get(name, name),
            value,
            palette.chart[COMPONENT_COLOURS.get(name, len(palette.chart) - 1) % len(palette.chart)],
            name in HATCHED,
        )
        for name, value in items.items()
        if value > 0
    ]


def measured_items(items: dict[str, float]) -> dict[str, float]:
    """``items`` with a ``measured`` correction spread over the model's items (each scaled by the same factor)."""
    if "measured" not in items:
        return items
    counted = sum(value for name, value in items.items() if name not in ("measured", "cuda_context"))
    factor = (counted + items["measured"]) / counted if counted > 0 else 1.0
    return {
        name: value if name == "cuda_context" else round(value * factor, 2)
        for name, value in items.items()
        if name != "measured"
    }


def tokens_text(sizing: Sizing, numbers: DataNumbers | None) -> str:
    """Where the token count comes from, in the Data step's words."""
    workload = sizing.plan.workload
    if sizing.tokens_source.endswith("steps at most"):
        return f"Tokens: {workload.tokens:,} in {sizing.tokens_source}."
    if numbers is None:
        return (
            f"Tokens: {workload.tokens:,} per epoch assumed, as no dataset is prepared yet. Choose one on the Data "
            "step for exact counts."
        )
    epochs = f"{workload.epochs:g} epoch{'' if workload.epochs == 1 else 's'}"
    examples = f"{numbers.train_examples:,} training example{'' if numbers.train_examples == 1 else 's'}"
    return f"Tokens: {numbers.train_tokens:,} per epoch for {epochs}, from {examples}. {counting_words(numbers)}"


def plan_headline(sizing: Sizing) -> str:
    """The model and method sized, with its size."""
    plan = sizing.plan
    trained = (
        f"{count_text(plan.trainable_params, long=True)} of them trained"
        if plan.setup.method.is_peft
        else "all trained"
    )
    return (
        f"{model_words(plan.arch.name)} with {method_words(plan.setup.method)}: "
        f"{count_text(plan.arch.total_params, long=True)} parameters, {trained}"
    )


class MemoryLegend(QWidget):
    """The bar's segments with their colour and size, in a grid that wraps instead of running over the axis."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setHorizontalSpacing(18)
        self.grid.setVerticalSpacing(4)
        self.entries: list[QLabel] = []

    def show_segments(self, segments: list[BarSegment]) -> None:
        """Lists ``segments`` in rows of :data:`LEGEND_COLUMNS`."""
        while self.grid.count():
            item = self.grid.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.entries = []
        for index, segment in enumerate(segments):
            mark = QLabel()
            mark.setPixmap(swatch(segment))
            text = QLabel(f"{segment.label}\N{NO-BREAK SPACE}{memory_text(segment.value, 2).replace(' ', chr(0xA0))}")
            text.setWordWrap(True)
            row, column = divmod(index, LEGEND_COLUMNS)
            entry = QHBoxLayout()
            entry.setSpacing(6)
            entry.addWidget(mark, 0, Qt.AlignmentFlag.AlignTop)
            entry.addWidget(text, 1)
            holder = QWidget()
            holder.setLayout(entry)
            entry.setContentsMargins(0, 0, 0, 0)
            self.grid.addWidget(holder, row, column, Qt.AlignmentFlag.AlignTop)
            self.entries.append(text)
        for column in range(LEGEND_COLUMNS):
            self.grid.setColumnStretch(column, 1)


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
        self.facts: DraftFacts | None = None
        self._key: str | None = None
        self._sizing: Running[DraftFacts] | None = None
        self._answered = True  # the latest sizing is shown (its task may still be finishing)
        self._failure: StepProblem | None = None
        self.body.addWidget(self._build_summary())
        self.body.addWidget(self._build_memory())
        self.body.addWidget(self._build_options(), 1)
        theme_events().sig_changed.connect(self._apply_palette)

    # -- layout ---------------------------------------------------------------------------------------------------

    def _build_summary(self) -> Card:
        box = Card()
        box.setAccessibleName("What is sized")
        self.status_label = QLabel("Choose a model on the Model step to size the job.")
        self.status_label.setObjectName("sizing_status")
        self.status_label.setWordWrap(True)
        self.status_label.setAccessibleName("Sizing status")
        font = self.status_label.font()
        font.setBold(True)
        self.status_label.setFont(font)
        self.tokens_label = caption()
        self.tokens_label.setAccessibleName("Tokens the sizing is for")
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setAccessibleName("Counting the dataset's tokens")
        self.progress_bar.hide()
        self.data_banner = Banner("warning")
        for widget in (self.status_label, self.tokens_label, self.progress_bar, self.data_banner):
            box.body.addWidget(widget)
        return box

    def _build_memory(self) -> Card:
        box = Card("Peak memory per GPU")
        self.memory_caption = caption()
        self.memory_caption.setAccessibleName("Which option the memory is shown for")
        self.chart = MemoryBarChart(CARD_SIZES_GIB)
        self.chart.setAccessibleName("Memory per GPU: one bar stacked by item, card sizes and the picked GPU marked")
        self.chart.show_empty("The memory the job needs appears here once it is sized.")
        self.legend = MemoryLegend()
        self.items_label = QLabel()
        self.items_label.setAccessibleName("Memory per GPU in all")
        font = self.items_label.font()
        font.setBold(True)
        self.items_label.setFont(font)
        for widget in (self.memory_caption, self.chart, self.legend, self.items_label):
            box.body.addWidget(widget)
        return box

    def _build_options(self) -> Card:
        box = Card("GPU options, cheapest that fits first")
        self.recommendation_label = QLabel()
        self.recommendation_label.setWordWrap(True)
        self.recommendation_label.setAccessibleName("Recommended GPU")
        self.options_table = pick_one_table(OPTION_COLUMNS, "GPU options: select the one you plan to use", 0)
        self.options_table.setMinimumHeight(TABLE_MIN_HEIGHT)
        self.options_table.itemSelectionChanged.connect(self.on_option_selected)
        self.suggestions_banner = Banner("warning")
        self.suggestions_button = plain_button("Change the settings", None, "Change the settings on the Model step")
        self.suggestions_button.clicked.connect(self.on_change_settings)
        self.suggestions_banner.add_action(self.suggestions_button)
        self.suggestions_label = self.suggestions_banner.details_label
        self.server_label = QLabel()
        self.server_label.setObjectName("sizing_server_warning")
        self.server_label.setWordWrap(True)
        self.server_label.setAccessibleName("Does the job fit your own server")
        for widget in (self.recommendation_label, self.options_table, self.suggestions_banner, self.server_label):
            box.body.addWidget(widget, 1 if widget is self.options_table else 0)
        return box

    # -- the wizard's hooks ---------------------------------------------------------------------------------------

    @property
    def sizing(self) -> Sizing | None:
        """The plan shown (None while none could be made)."""
        return self.facts.sizing if self.facts is not None else None

    @property
    def running(self) -> bool:
        """Whether the job is being sized (its data maybe counted again)."""
        return self._sizing is not None and self._sizing.active and not self._answered

    @property
    def busy(self) -> bool:
        """Sizing in progress: Enter waits for it."""
        return self.running

    def show_draft(self) -> None:
        """Sizes the job again when the model, method, settings or data changed since the last time."""
        if _sizing_key(self.draft) != self._key:
            self._sizing = self._start_sizing()
        elif self.sizing is not None:
            self._show_server_fit(self.sizing)
        else:
            self.show_problem(self.step_problem(), focus=False)  # what still blocks Next, shown again

    def step_problem(self) -> StepProblem | None:
        """Blocks while sizing and when the job cannot be sized at all; a job too big for every GPU is not blocked."""
        if self.running:
            return StepProblem("The job is still being sized", "Next works once the sizing is done.")
        if self._failure is not None:
            return self._failure
        error = self.facts.sizing_error if self.facts is not None else None
        if error is None:
            return None
        step = _STEP_OF_SETTING.get(error.setting, "")
        label = "the model" if error.setting == "base_model" else SETTING_LABELS.get(error.setting, "the settings")
        return StepProblem(error.headline, error.details, step=step, setting=error.setting, action=f"Change {label}")

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
        self._sizing = self._start_sizing()
        await self._sizing.wait()

    def _start_sizing(self) -> Running[DraftFacts]:
        """Starts sizing a copy of the draft; an older sizing still running is dropped."""
        snapshot, secrets = self.draft.model_copy(deep=True), self.context.secrets
        self.status_label.setText(f"Sizing {model_words(snapshot.base_model) or 'the job'}…")
        self.progress_bar.setValue(0)
        self._answered, self._failure = False, None
        running = (
            Operation(
                self,
                lambda job: draft_facts(snapshot, secrets, progress=job.report, cancel=job.cancel),
                self._sized,
                group="sizing",
            )
            .with_progress(self._on_progress)
            .failure(self._sizing_failed)
            .run()
        )
        self.sig_changed.emit()
        return running

    def _sizing_failed(self, exc: Exception) -> None:
        """Says the sizing broke (Back and Next again retries), then sends the error on to the app's reporter."""
        self._answered = True
        self.progress_bar.hide()
        self._key = None
        self.status_label.setText("The sizing stopped unexpectedly.")
        self._failure = StepProblem(
            "The sizing stopped unexpectedly", "Go back a step and come here again to retry; the log has the details."
        )
        self.show_problem(self._failure, focus=False)
        raise exc

    def _on_progress(self, fraction: float) -> None:
        self.progress_bar.show()
        self.status_label.setText("Counting the dataset's tokens with the model's tokenizer…")
        self.progress_bar.setValue(round(fraction * 1000))

    def _sized(self, facts: DraftFacts) -> None:
        self._answered = True
        self.progress_bar.hide()
        facts.apply(self.draft)  # the draft now points at the files these numbers describe
        self.facts, self._key = facts, _sizing_key(self.draft)
        self._show_data(facts)
        if facts.sizing is None:
            self._show_unsized()
        else:
            self._show_sizing(facts.sizing)
        self.sig_changed.emit()

    def _show_data(self, facts: DraftFacts) -> None:
        self.data_banner.show_message(
            "warning", "The data could not be counted again" if facts.data_error else "", facts.data_error
        )

    def _show_unsized(self) -> None:
        problem = self.step_problem()
        self.status_label.setText(problem.headline if problem else "The job cannot be sized.")
        self.tokens_label.clear()
        self.chart.show_empty("Nothing to draw: the job cannot be sized yet.")
        self.legend.show_segments([])
        self.memory_caption.clear()
        for label in (self.items_label, self.recommendation_label, self.server_label):
            label.clear()
        self.suggestions_banner.show_message("warning", "")
        self.options_table.setRowCount(0)
        self.show_problem(problem, focus=False)

    def _show_sizing(self, sizing: Sizing) -> None:
        self.show_problem(None)
        self.status_label.setText(plan_headline(sizing))
        tokens = tokens_text(sizing, self.facts.numbers if self.facts else None)
        measured = f" {sizing.measured[:1].upper()}{sizing.measured[1:]}." if sizing.measured else ""
        self.tokens_label.setText(tokens + measured)  # times from a GPU measured on the user's own runs say so
        self._fill_table(sizing)
        self._show_suggestions(sizing)
        self._show_server_fit(sizing)
        self._select(self.draft.gpu_name, sizing)

    def _fill_table(self, sizing: Sizing) -> None:
        table, recommended, palette = self.options_table, sizing.recommended, current_palette()
        table.blockSignals(True)
        table.clearSelection()
        table.setRowCount(len(sizing.plan.options))
        for row, option in enumerate(sizing.plan.options):
            name = option.gpu.name + (f", {option.strategy.value.upper()}" if option.total_gpus > 1 else "")
            if option.nodes > 1:
                name += f", {option.nodes} machines ({option.gpu.inter_node})"
            if option is recommended:
                name += " (recommended)"
            gpus = f"{option.nodes} x {option.count}" if option.nodes > 1 else str(option.count)
            cells = [name, gpus, "", format_hours(option.hours), f"${option.cost_usd:,.2f}"]
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(text or fit_text(option))
                item.setData(Qt.ItemDataRole.UserRole, option_label(option))
                if column in (1, 3, 4):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if option is recommended:
                    font = QFont(item.font())
                    font.setBold(True)
                    item.setFont(font)
                    item.setBackground(QBrush(QColor(palette.success_bg)))
                table.setItem(row, column, item)
            table.setCellWidget(row, 2, self._fit_badge(option))
        table.resizeColumnsToContents()
        table.blockSignals(False)
        self.recommendation_label.setText(_recommendation_text(recommended))

    @staticmethod
    def _fit_badge(option: GpuOption) -> QWidget:
        holder = QWidget()
        layout = QHBoxLayout(holder)
        layout.setContentsMargins(6, 2, 6, 2)
        layout.addWidget(Badge(fit_text(option), fit_severity(option)))
        layout.addStretch(1)
        return holder

    def _select(self, label: str, sizing: Sizing) -> None:
        """Selects the draft's pick when it is still an option, else the recommendation, and draws its memory."""
        labels = [option_label(o) for o in sizing.plan.options]
        recommended = sizing.recommended
        wanted = label if label in labels else (option_label(recommended) if recommended else None)
        if wanted is None:
            self.draft.gpu_name = ""
            self._show_memory(sizing, None)
            return
        # A pre-selection is not the user's pick: it reaches the draft only when they move on (save_into).
        with QSignalBlocker(self.options_table.selectionModel()):
            self.options_table.selectRow(labels.index(wanted))
        self._show_memory(sizing, sizing.option(wanted))

    def _show_memory(self, sizing: Sizing, option: GpuOption | None) -> None:
        """Draws the memory per GPU of ``option`` (the plan's own setup without one), its GPU's memory across it."""
        memory = option.memory if option is not None else sizing.plan.memory
        segments = memory_segments(memory.items, current_palette())
        capacity = Capacity(option.gpu.name, option.gpu.usable_gb) if option is not None else None
        self.chart.show_segments(segments, capacity)
        self.legend.show_segments(segments)
        self.items_label.setText(f"Total: {memory_text(memory.per_gpu_total, 2)} per GPU")
        if option is None:
            self.memory_caption.setText("For the settings as chosen, on one GPU. Select an option to compare.")
        else:
            self.memory_caption.setText(
                f"For {option_words(option)}: {memory_text(memory.per_gpu_total)} {split_words(option)}; "
                f"{'each' if option.total_gpus > 1 else 'the'} {option.gpu.name} has "
                f"{memory_text(option.gpu.usable_gb)} usable."
            )

    def _selected_label(self) -> str | None:
        rows = self.options_table.selectionModel().selectedRows()
        item = self.options_table.item(rows[0].row(), 0) if rows else None
        return str(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None

    def on_option_selected(self) -> None:
        """Records the selected option as the draft's GPU pick and draws its memory."""
        label = self._selected_label()
        if label is None or self.sizing is None:
            return
        self._show_memory(self.sizing, self.sizing.option(label))
        if label != self.draft.gpu_name:
            self.draft.gpu_name = label
            self.sig_changed.emit()

    def _show_suggestions(self, sizing: Sizing) -> None:
        if sizing.recommended is not None:
            self.suggestions_banner.show_message("warning", "")
            return
        self.suggestions_button.setVisible(True)
        self.suggestions_banner.show_message("danger", "Nothing fits any GPU as configured", _suggestions_text(sizing))

    def on_change_settings(self) -> None:
        """Goes to the Model step, at the first setting a suggestion changes."""
        suggestions = self.sizing.plan.suggestions if self.sizing is not None else []
        setting = suggestions[0].changes[0].setting if suggestions and suggestions[0].changes else "method"
        self.sig_go_to.emit("model", setting if setting in SETTING_LABELS else "method")

    def _show_server_fit(self, sizing: Sizing) -> None:
        """Warns (without blocking) when the tested own server's GPU is too small for the job."""
        self.server_label.setText(server_fit_warning(self.draft.target.gpu, sizing))
        self.server_label.setVisible(bool(self.server_label.text()))

    def _apply_palette(self, _palette: Palette) -> None:
        """Redraws the bar and table in the new theme's colours."""
        if self.sizing is not None:
            self._fill_table(self.sizing)
            self._select(self.draft.gpu_name, self.sizing)


def _recommendation_text(option: GpuOption | None) -> str:
    if option is None:
        return "Nothing fits as configured: see what to change below."
    return (
        f"Recommended: {option_words(option)}, {fit_text(option)}, about {format_hours(option.hours)} and "
        f"${option.cost_usd:,.2f} at list price."
    )


def _suggestions_text(sizing: Sizing) -> str:
    if not sizing.plan.suggestions:
        return "Even smaller settings do not fit: choose a smaller model, or QLoRA, on the Model step."
    lines = ["These changes on the Model step make it fit:"]
    for suggestion in sizing.plan.suggestions:
        option = suggestion.option
        changes = ", ".join(change_words(change) for change in suggestion.changes)
        lines.append(
            f"• {changes}: {option_words(option)}, {memory_text(option.memory.per_gpu_total)} per GPU, "
            f"{format_hours(option.hours)}, ${option.cost_usd:,.2f}"
        )
    return "\n".join(lines)
