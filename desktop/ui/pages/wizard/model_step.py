"""Wizard step "Model and method": which model to fine-tune, how, and (folded away) the training settings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QRadioButton,
    QSpinBox,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.core.data.formats import TRAINS_ON, DataFormat, objective_data_problem
from desktop.core.model_names import is_local_model
from desktop.core.runs.draft import DEFAULT_TRAINING, RunDraft
from desktop.core.sizing.catalog import CatalogEntry, ModelCatalog
from desktop.core.sizing.setup import SETTING_RANGES
from desktop.core.units import count_text
from desktop.services.models.configs import load_catalog
from desktop.services.platform.logs import get_logger
from desktop.ui.background import off_ui_thread
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.step_base import StepProblem, WizardStep, enter_applies_here
from desktop.ui.widgets.blocks import Card, caption, plain_button, set_role
from desktop.ui.widgets.number_fields import CorrectionNote
from desktop.ui.widgets.tables import pick_one_table
from trainer_payload.protocol import JOB_INT_RANGES, PREFERENCE_OBJECTIVES, job_default

_log = get_logger("ui.model_step")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
_CATALOG_COLUMNS = ["Model (Hub id)", "Family", "Parameters", "Context", "Licence"]
#: Rows of the catalog shown before it scrolls.
CATALOG_ROWS = 7
#: Columns of label and box pairs in the advanced settings grid.
ADVANCED_COLUMNS = 2

#: (value, radio label, one-line explanation) for each fine-tuning method.
METHODS: list[tuple[str, str, str]] = [
    (
        "qlora",
        "&QLoRA",
        "Trains a small add-on (adapter) on a 4-bit copy of the model: the least GPU memory and cost. A good start.",
    ),
    (
        "lora",
        "L&oRA",
        "Trains the same adapter on the full-precision model: slightly better and faster, about twice the memory.",
    ),
    ("full", "&Full", "Changes every weight of the model: the most thorough, and needs several times more GPU memory."),
    (
        "full-8bit",
        "Full, &8-bit optimizer",
        "Changes every weight but keeps the optimizer's state in 8 bits: a full fine-tune in less memory.",
    ),
]
PEFT_METHODS = {"qlora", "lora"}

#: (value, radio label, one-line explanation) for each objective the wizard trains.
OBJECTIVES: list[tuple[str, str, str]] = [
    (
        "sft",
        "S&upervised fine-tuning",
        "Learns to answer like the conversations in your data. For a file of conversations.",
    ),
    (
        "dpo",
        "&DPO: prefer the chosen answer",
        "Learns to prefer each pair's chosen answer over the rejected one: fixes tone and refusals that fine-tuning "
        "on chats leaves. The usual choice for preference pairs.",
    ),
    (
        "orpo",
        "O&RPO: preference without a reference",
        "Learns the chosen answers and the preference in one stage, with no reference model: less memory than a "
        "full DPO. For preference pairs.",
    ),
    (
        "cpt",
        "Continued &pre-training",
        "Learns the language of your domain from raw text: its words, facts and style. It does not learn to chat: "
        "fine-tune on conversations after it. For raw text.",
    ),
]
#: What the data step can find, in words (what each objective trains on: ``TRAINS_ON``).
_HOLDS = {"pairs": "preference pairs", "text": "raw text"}


def objective_needs(objective: str, data_format: str) -> str:
    """Why an objective cannot be chosen for the data at hand: what it needs and what the data holds."""
    if not data_format:
        return f"Needs {TRAINS_ON[objective]}: choose such a file on the Data step."
    return f"Needs {TRAINS_ON[objective]}: your data holds {_HOLDS.get(data_format, 'conversations')}."


#: The payload's preference strength: (lowest, highest) the box allows, and its default.
BETA_RANGE = (0.001, 10.0)
BETA_DEFAULT = float(job_default("beta"))


@dataclass(frozen=True)
class TrainingField:
    """One advanced setting: a key of ``draft.training`` and how to edit it.

    Attributes:
        key: The training key (the payload's job key).
        label: Shown beside the box.
        low: Smallest value allowed.
        high: Largest value allowed.
        step: Arrow-key step.
        decimals: 0 for whole numbers (a QSpinBox); otherwise a QDoubleSpinBox.
        lora_only: Only matters for LoRA and QLoRA.
    """

    key: str
    label: str
    low: float
    high: float
    step: float
    decimals: int = 0
    lora_only: bool = False


TRAINING_FIELDS: list[TrainingField] = [
    TrainingField("lora_r", "LoRA rank (adapter size)", *SETTING_RANGES["lora_r"], 8, lora_only=True),
    TrainingField("lora_alpha", "LoRA alpha (adapter strength)", *JOB_INT_RANGES["lora_alpha"], 8, lora_only=True),
    TrainingField("seq_len", "Sequence length (tokens)", *SETTING_RANGES["seq_len"], 256),
    TrainingField("micro_batch", "Examples per GPU step (micro-batch)", *SETTING_RANGES["micro_batch"], 1),
    TrainingField("grad_accum", "Gradient accumulation steps", *SETTING_RANGES["grad_accum"], 1),
    TrainingField("epochs", "Epochs (passes over the data)", 0.1, 1000, 0.5, decimals=2),
    TrainingField("learning_rate", "Learning rate", 1e-7, 0.5, 1e-5, decimals=10),
    TrainingField("checkpoint_minutes", "Checkpoint every (minutes)", 1, 1440, 5),
    TrainingField("keep_checkpoints", "Checkpoints kept on the GPU machine", *JOB_INT_RANGES["keep_checkpoints"], 1),
    TrainingField(
        "eval_steps", "Evaluate held-out rows every (steps; 0: ten times a run)", *JOB_INT_RANGES["eval_steps"], 10
    ),
    TrainingField("max_steps", "Quick trial: stop after (steps; 0: train every epoch)", 0, 10_000_000, 10),
]


#: The trackers offered under Advanced: the check box's words, its accessible name and its tool tip.
TRACKER_CHOICES = {
    "tensorboard": (
        "TensorBoard &logs (they come home with every checkpoint)",
        "Write TensorBoard logs",
        "The machine writes every logged value as TensorBoard event files; the monitor's TensorBoard button shows "
        "them on this computer.",
    ),
    "trackio": (
        "trac&kio database (comes home with every checkpoint)",
        "Write a trackio database",
        "The machine logs every value into trackio's database; the monitor's trackio button opens trackio's "
        "dashboard on this computer.",
    ),
    "wandb": (
        "We&ights && Biases (sent from the machine with your W&&B key)",
        "Send metrics to Weights & Biases",
        "The machine sends every logged value to your W&B account. Your W&B key (Settings, API keys) reaches the "
        "trainer over its input, never a file on the machine; if W&B cannot be reached, training goes on.",
    ),
}


class ScientificSpinBox(QDoubleSpinBox):
    """A double spin box that shows small numbers compactly (``0.0002``, ``1e-05``) and accepts ``2e-4``."""

    def textFromValue(self, value: float) -> str:
        """Shows the value in its shortest form."""
        return f"{value:g}"

    def valueFromText(self, text: str) -> float:
        """Reads plain or scientific notation."""
        try:
            return float(text)
        except ValueError:
            return self.value()

    def validate(self, text: str, pos: int) -> tuple[QValidator.State, str, int]:
        """Accepts any number in range; partial input such as ``2e-`` is intermediate."""
        try:
            value = float(text)
        except ValueError:
            return QValidator.State.Intermediate, text, pos
        inside = self.minimum() <= value <= self.maximum()
        return (QValidator.State.Acceptable if inside else QValidator.State.Intermediate), text, pos


def parameters_text(entry: CatalogEntry) -> str:
    """Parameter count as "7.6 B" or "494 M" (with the active share for mixture-of-experts models)."""
    arch = entry.arch
    total = count_text(arch.total_params)
    return total if arch.num_experts <= 1 else f"{total} ({count_text(arch.active_params)} active)"


def entry_matches(entry: CatalogEntry, query: str) -> bool:
    """Whether every word of ``query`` appears in the entry's id, family, licence or aliases."""
    haystack = " ".join([entry.id, entry.family, entry.license, *entry.aliases]).lower()
    return all(word in haystack for word in query.lower().split())


def _spin_box(field: TrainingField) -> QSpinBox | QDoubleSpinBox:
    box: QSpinBox | QDoubleSpinBox
    if field.decimals == 0:
        box = QSpinBox()
        box.setRange(int(field.low), int(field.high))
        box.setSingleStep(int(field.step))
    else:
        box = ScientificSpinBox() if field.key == "learning_rate" else QDoubleSpinBox()
        box.setDecimals(field.decimals)
        box.setRange(field.low, field.high)
        box.setSingleStep(field.step)
    box.setAccessibleName(field.label)
    box.setGroupSeparatorShown(field.decimals == 0)
    set_role(box, "number")  # a plain field: typed, or stepped with the Up and Down keys; no arrow buttons
    box.setToolTip(f"{field.label}: type a number, or step it with the Up and Down keys")
    return box


def _choice(
    group: QButtonGroup, label: str, explanation: str, kind: str, *, bottom: int
) -> tuple[QRadioButton, QLabel]:
    """A radio button of ``group`` (named for screen readers as a ``kind``) and its explanation, indented under it."""
    button = QRadioButton(label)
    button.setAccessibleName(f"{label.replace('&', '')} {kind}")
    button.setAccessibleDescription(explanation)
    group.addButton(button)
    note = caption(explanation)
    note.setContentsMargins(28, 0, 0, bottom)
    return button, note


class ModelStep(WizardStep):
    """Chooses the base model (catalog, Hub id or local folder), the method, and the training settings."""

    step_name = "model"
    title = "Model and method"
    purpose = (
        "Choose the model to fine-tune and how. The catalog lists popular open models; any Hugging Face Hub id or "
        "a model folder on this computer works too."
    )

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.catalog: ModelCatalog | None = None
        self.spins: dict[str, QSpinBox | QDoubleSpinBox] = {}
        #: Each setting's own line saying why a number typed there was changed.
        self.notes: dict[str, CorrectionNote] = {}
        self.body.addWidget(self._build_catalog())
        self.body.addWidget(self._build_objectives())
        self.body.addWidget(self._build_methods())
        self.body.addWidget(self._build_advanced())
        self.body.addStretch(1)
        self.show_draft()

    # -- layout ---------------------------------------------------------------------------------------------------

    def _build_catalog(self) -> Card:
        box = Card("Model")
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Type to filter: qwen, 8b, apache…")
        self.filter_edit.setAccessibleName("Filter the model catalog")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self.on_filter_changed)
        enter_applies_here(self.filter_edit)
        self.catalog_table = pick_one_table(_CATALOG_COLUMNS, "Model catalog", stretch_column=4)
        # Hub ids are shown whole; the licence column takes what is left.
        self.catalog_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.catalog_table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.catalog_table.setWordWrap(False)
        rows = self.catalog_table.verticalHeader().defaultSectionSize() * CATALOG_ROWS
        self.catalog_table.setMinimumHeight(rows + self.catalog_table.horizontalHeader().sizeHint().height() + 4)
        self.catalog_table.itemSelectionChanged.connect(self.on_catalog_selected)
        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("e.g. Qwen/Qwen2.5-7B-Instruct or /path/to/model-folder")
        self.model_edit.setAccessibleName("Hub id or local model folder")
        self.model_edit.textEdited.connect(self.on_model_edited)
        # a folder's path is wider than the field at 1024 px: the whole of it on hover
        self.model_edit.textChanged.connect(
            lambda text: self.model_edit.setToolTip(text if is_local_model(text) else "")
        )
        self.browse_button = plain_button("Bro&wse…", "folder-open", "Choose a local model folder")
        self.browse_button.clicked.connect(self.on_browse_clicked)
        box.body.addLayout(self._labelled("&Search the catalog", self.filter_edit))
        box.body.addWidget(self.catalog_table)
        box.body.addLayout(self._labelled("&Model: Hub id or local folder", self.model_edit, self.browse_button))
        return box

    @staticmethod
    def _labelled(text: str, field: QWidget, *extra: QWidget) -> QHBoxLayout:
        row = QHBoxLayout()
        label = QLabel(text)
        label.setBuddy(field)
        row.addWidget(label)
        row.addWidget(field, 1)
        for widget in extra:
            row.addWidget(widget)
        return row

    def _build_objectives(self) -> Card:
        box = Card("What the model learns")
        self.objective_group = QButtonGroup(self)
        self.objective_buttons: dict[str, QRadioButton] = {}
        self.objective_notes: dict[str, QLabel] = {}
        for value, label, explanation in OBJECTIVES:
            button, note = _choice(self.objective_group, label, explanation, "objective", bottom=6)
            button.toggled.connect(self.on_objective_toggled)
            self.objective_buttons[value], self.objective_notes[value] = button, note
            box.body.addWidget(button)
            box.body.addWidget(note)
        self.beta_spin = ScientificSpinBox()
        self.beta_spin.setDecimals(4)
        self.beta_spin.setRange(*BETA_RANGE)
        self.beta_spin.setSingleStep(0.05)
        self.beta_spin.setAccessibleName("Preference strength (beta)")
        set_role(self.beta_spin, "number")
        self.beta_spin.valueChanged.connect(lambda _value: self.sig_changed.emit())
        self.beta_spin.setFixedWidth(120)
        self.beta_row = QWidget()
        row = QHBoxLayout(self.beta_row)
        row.setContentsMargins(28, 0, 0, 0)
        beta_label = QLabel("Preference s&trength (beta)")
        beta_label.setBuddy(self.beta_spin)
        row.addWidget(beta_label)
        row.addWidget(self.beta_spin)
        row.addStretch(1)
        self.beta_row.setToolTip(
            "How far the model may move from its base to prefer the chosen answers: lower moves further. "
            f"{BETA_DEFAULT:g} suits most pairs."
        )
        box.body.addWidget(self.beta_row)
        return box

    def _build_methods(self) -> Card:
        box = Card("Method")
        grid = QGridLayout()
        grid.setHorizontalSpacing(24)
        grid.setVerticalSpacing(2)
        self.method_group = QButtonGroup(self)
        self.method_buttons: dict[str, QRadioButton] = {}
        for index, (value, label, explanation) in enumerate(METHODS):
            button, note = _choice(self.method_group, label, explanation, "method", bottom=8)
            button.toggled.connect(self.on_method_toggled)
            self.method_buttons[value] = button
            row, column = divmod(index, 2)
            grid.addWidget(button, row * 2, column)
            grid.addWidget(note, row * 2 + 1, column, Qt.AlignmentFlag.AlignTop)
        for column in range(2):
            grid.setColumnStretch(column, 1)
        box.body.addLayout(grid)
        return box

    def _build_advanced(self) -> QWidget:
        holder = QWidget()
        layout = QVBoxLayout(holder)
        layout.setContentsMargins(0, 0, 0, 0)
        self.advanced_toggle = QToolButton()
        self.advanced_toggle.setText("&Advanced settings")
        self.advanced_toggle.setAccessibleName("Show the advanced training settings")
        self.advanced_toggle.setCheckable(True)
        self.advanced_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.advanced_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.advanced_toggle.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.advanced_toggle.toggled.connect(self.on_advanced_toggled)
        layout.addWidget(self.advanced_toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.advanced_box = Card()
        self.advanced_box.setAccessibleName("Advanced training settings")
        grid = QGridLayout()
        grid.setHorizontalSpacing(16)
        for index, field in enumerate(TRAINING_FIELDS):
            spin = _spin_box(field)
            spin.setMinimumWidth(120)
            spin.valueChanged.connect(lambda _value: self.sig_changed.emit())
            self.spins[field.key] = spin
            self.notes[field.key] = note = CorrectionNote()
            note.watch(spin, field.label)
            label = QLabel(field.label)
            label.setBuddy(spin)
            label.setWordWrap(True)
            row, pair = divmod(index, ADVANCED_COLUMNS)
            grid.addWidget(label, row * 2, pair * 2)
            grid.addWidget(spin, row * 2, pair * 2 + 1)
            grid.addWidget(note, row * 2 + 1, pair * 2, 1, 2)  # under its own field: each correction said there
        for pair in range(ADVANCED_COLUMNS):
            grid.setColumnStretch(pair * 2, 1)
        self.advanced_box.body.addLayout(grid)
        self.lora_note = caption("LoRA rank and alpha only matter for LoRA and QLoRA.")
        self.advanced_box.body.addWidget(self.lora_note)
        self.advanced_box.body.addWidget(caption("Report the training's metrics to:"))
        self.tracker_checks: dict[str, QCheckBox] = {}
        for tracker, (text, name, tip) in TRACKER_CHOICES.items():
            check = QCheckBox(text)
            check.setAccessibleName(name)
            check.setToolTip(tip)
            check.toggled.connect(lambda _on: self.sig_changed.emit())
            self.tracker_checks[tracker] = check
            self.advanced_box.body.addWidget(check)
        self.tensorboard_check = self.tracker_checks["tensorboard"]
        self.advanced_box.setVisible(False)
        layout.addWidget(self.advanced_box)
        return holder

    # -- the wizard's interface -----------------------------------------------------------------------------------

    @property
    def method(self) -> str:
        """The method chosen."""
        return next((value for value, button in self.method_buttons.items() if button.isChecked()), "qlora")

    @property
    def objective(self) -> str:
        """The objective chosen."""
        return next((value for value, button in self.objective_buttons.items() if button.isChecked()), "sft")

    def show_draft(self) -> None:
        """Fills the model, objective, method and settings from the draft."""
        draft = self.draft
        self.model_edit.setText(draft.base_model)
        self._select_catalog_row(draft.base_model)
        self._show_objectives(draft)
        for tracker, check in self.tracker_checks.items():
            check.setChecked(tracker in draft.training.get("report_to", []))
        self.method_buttons.get(draft.method, self.method_buttons["qlora"]).setChecked(True)
        for key, spin in self.spins.items():
            value = draft.training.get(key, DEFAULT_TRAINING[key])
            if isinstance(spin, QSpinBox):
                spin.setValue(int(value))
            else:
                spin.setValue(float(value))

    def step_problem(self) -> StepProblem | None:
        """A model is required and must look like something that can be loaded; the settings must suit it."""
        model = self.model_edit.text().strip()
        if not model:
            return StepProblem(
                "Choose a model",
                "Pick one in the catalog, or type a Hugging Face Hub id (org/name) or the folder of a model on this "
                "computer.",
                self.model_edit,
            )
        return self._model_problem(model) or self._context_problem(model)

    def show_problem(self, problem: StepProblem | None, *, focus: bool = True) -> None:
        """Unfolds the advanced settings first when the field that fixes the problem is one of them."""
        if problem is not None and problem.field in self.spins.values():
            self.advanced_toggle.setChecked(True)
        super().show_problem(problem, focus=focus)

    def focus_field(self, setting: str) -> None:
        """Focuses the model field (``base_model``), the method, or a training setting's box (unfolding them)."""
        field: QWidget | None = self.spins.get(setting)
        if field is not None:
            self.advanced_toggle.setChecked(True)
        elif setting == "method":
            field = self.method_buttons[self.method]
        elif setting == "base_model":
            field = self.model_edit
        if field is not None:
            self.scroll_area.ensureWidgetVisible(field)
            field.setFocus(Qt.FocusReason.OtherFocusReason)

    def save_into(self, draft: RunDraft) -> None:
        """Writes the model, the method and the training settings (other training keys are kept)."""
        draft.base_model = self.model_edit.text().strip()
        draft.method = self.method
        draft.training = {**draft.training, **self.training_values()}
        objective = self.objective
        for key in ("objective", "beta", "loss_type"):
            draft.training.pop(key, None)
        if objective != "sft":  # SFT is the payload's default: a chat run's spec says nothing of objectives
            draft.training["objective"] = objective
        if objective in PREFERENCE_OBJECTIVES:
            draft.training["beta"] = self.beta_spin.value()
        draft.training.pop("report_to", None)
        trackers = [tracker for tracker, check in self.tracker_checks.items() if check.isChecked()]
        if trackers:
            draft.training["report_to"] = trackers

    def training_values(self) -> dict[str, Any]:
        """The advanced settings as training keys (whole numbers as ints)."""
        return {key: spin.value() for key, spin in self.spins.items()}

    async def load(self) -> None:
        """Reads the bundled catalog off the UI thread and lists it."""
        self.catalog = await off_ui_thread(self, load_catalog)
        self._fill_catalog(self.catalog)
        self._select_catalog_row(self.model_edit.text().strip())

    # -- validation -----------------------------------------------------------------------------------------------

    def _model_problem(self, model: str) -> StepProblem | None:
        if self.catalog is not None and self.catalog.entry(model) is not None:
            return None
        path = Path(model).expanduser()
        if path.is_absolute() or model.startswith((".", "~")):
            if not path.is_dir():
                return StepProblem(
                    f"There is no folder {model}",
                    "Choose the folder holding the model's files (Browse…).",
                    self.model_edit,
                )
            if not (path / "config.json").is_file():
                return StepProblem(
                    f"{model} has no config.json", "Choose the folder that holds the model's files.", self.model_edit
                )
            return None
        if _HUB_ID.fullmatch(model):
            return None
        hints = self.catalog.suggestions(model) if self.catalog is not None else []
        hint = f"Did you mean {', '.join(hints[:3])}? " if hints else ""
        return StepProblem(
            f"{model} is not in the catalog, not a Hub id (org/name) and not a folder",
            hint
            + "Pick a model in the catalog, type a Hub id such as Qwen/Qwen2.5-7B-Instruct, or Browse… for a folder.",
            self.model_edit,
        )

    def _context_problem(self, model: str) -> StepProblem | None:
        entry = self.catalog.entry(model) if self.catalog is not None else None
        seq_len = self.spins["seq_len"].value()
        if entry is None or not entry.arch.max_context or seq_len <= entry.arch.max_context:
            return None
        return StepProblem(
            f"The sequence length {seq_len:,} is longer than {entry.id} handles: {entry.arch.max_context:,} tokens",
            "Lower the sequence length under Advanced settings.",
            self.spins["seq_len"],
        )

    # -- catalog --------------------------------------------------------------------------------------------------

    def _fill_catalog(self, catalog: ModelCatalog) -> None:
        table = self.catalog_table
        table.blockSignals(True)
        table.setRowCount(len(catalog))
        for row, entry in enumerate(catalog):
            context = f"{entry.arch.max_context:,}" if entry.arch.max_context else "unknown"
            cells = [entry.id, entry.family, parameters_text(entry), context, entry.license]
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, entry.id)
                table.setItem(row, column, item)
        table.blockSignals(False)
        self.on_filter_changed(self.filter_edit.text())

    def _select_catalog_row(self, model: str) -> None:
        entry = self.catalog.entry(model) if self.catalog is not None and model else None
        table = self.catalog_table
        table.blockSignals(True)
        table.clearSelection()
        for row in range(table.rowCount()):
            if entry is not None and self._row_id(row) == entry.id:
                table.selectRow(row)
                table.scrollTo(table.model().index(row, 0))
        table.blockSignals(False)

    def visible_models(self) -> list[str]:
        """Hub ids of the catalog rows the filter leaves visible."""
        table = self.catalog_table
        return [self._row_id(row) for row in range(table.rowCount()) if not table.isRowHidden(row)]

    def _row_id(self, row: int) -> str:
        item = self.catalog_table.item(row, 0)
        return item.text() if item is not None else ""

    # -- handlers -------------------------------------------------------------------------------------------------

    def on_filter_changed(self, text: str) -> None:
        """Hides the catalog rows that do not match every typed word."""
        if self.catalog is None:
            return
        for row, entry in enumerate(self.catalog):
            self.catalog_table.setRowHidden(row, not entry_matches(entry, text))

    def on_catalog_selected(self) -> None:
        """Choosing a catalog row makes it the model."""
        items = self.catalog_table.selectedItems()
        if items:
            self.model_edit.setText(str(items[0].data(Qt.ItemDataRole.UserRole)))
            _log.debug("model %s chosen from the catalog", self.model_edit.text())
            self.sig_changed.emit()

    def on_model_edited(self, text: str) -> None:
        """A typed model highlights its catalog row, if it has one."""
        self._select_catalog_row(text.strip())
        self.sig_changed.emit()

    def on_browse_clicked(self) -> None:
        """Picks a local model folder."""
        folder = QFileDialog.getExistingDirectory(self, "Choose a model folder", str(Path.home()))
        if folder:
            self.model_edit.setText(folder)
            self._select_catalog_row("")
            self.sig_changed.emit()

    def _show_objectives(self, draft: RunDraft) -> None:
        """Offers the objectives the data can train (the others greyed, saying what they need)."""
        draft.fit_objective_to_data()
        fmt = DataFormat(draft.data_format) if draft.data_format in _HOLDS else DataFormat.MESSAGES
        for value, button in self.objective_buttons.items():
            usable = not objective_data_problem(value, fmt)
            button.setEnabled(usable)
            explanation = next(text for key, _label, text in OBJECTIVES if key == value)
            self.objective_notes[value].setText(explanation if usable else objective_needs(value, draft.data_format))
            self.objective_notes[value].setEnabled(usable)
        self.objective_buttons.get(draft.objective, self.objective_buttons["sft"]).setChecked(True)
        self.beta_spin.setValue(float(draft.training.get("beta", BETA_DEFAULT)))
        self.on_objective_toggled()

    def on_objective_toggled(self) -> None:
        """The preference strength applies to DPO and ORPO only: shown with them."""
        self.beta_row.setVisible(self.objective in PREFERENCE_OBJECTIVES)
        self.sig_changed.emit()

    def on_method_toggled(self) -> None:
        """LoRA settings only apply to LoRA and QLoRA: they are disabled for full fine-tunes."""
        peft = self.method in PEFT_METHODS
        for field in TRAINING_FIELDS:
            if field.lora_only:
                self.spins[field.key].setEnabled(peft)
        self.lora_note.setVisible(not peft)
        self.sig_changed.emit()

    def on_advanced_toggled(self, shown: bool) -> None:
        """Unfolds or folds the advanced settings."""
        self.advanced_box.setVisible(shown)
        self.advanced_toggle.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        self.advanced_toggle.setAccessibleName(f"{'Hide' if shown else 'Show'} the advanced training settings")
