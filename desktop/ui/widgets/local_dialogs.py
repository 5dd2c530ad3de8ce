"""The questions before a local step: what to export (or what to compare on), from which base, and what it needs.

Each dialog shows what is missing on this computer with its size before anything starts (:class:`NeedsPanel`), and
its start button stays disabled while a library is missing or the base model cannot be found. Open them with
:meth:`QDialog.open` and read :meth:`ExportDialog.request` / :meth:`CompareDialog.choice` on ``accepted``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop.core.export.compatibility import OutputFormat, Verdict
from desktop.core.judging.checks import regex_problem
from desktop.services.local.base_model import base_description
from desktop.services.local.common import LocalToolError
from desktop.services.local.export import DEFAULT_GGUF, ExportRequest, judge_outputs
from desktop.services.local.gguf import QUANT_TYPES
from desktop.services.local.needs import LocalNeeds, local_needs, needs_now
from desktop.services.local.tools import LocalStep
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.adapters import ReturnedAdapter
from desktop.ui.app_words import sentence
from desktop.ui.background import CoroutineOperation
from desktop.ui.widgets.blocks import caption, heading, plain_button, primary_button
from desktop.ui.widgets.local_words import adapter_title, people_words
from desktop.ui.widgets.needs_panel import NeedsPanel

#: Each GGUF type in a few words, for its tick box (the whole sentence is its tooltip).
QUANT_SHORT = {
    "Q4_K_M": "smallest good (recommended)",
    "Q5_K_M": "a little closer",
    "Q6_K": "close to full quality",
    "Q8_0": "almost lossless, 2 x Q4",
    "F16": "full 16-bit, the largest",
}
#: Each output as the verdict line names it.
FORMAT_WORDS = {
    OutputFormat.GGUF: "GGUF",
    OutputFormat.LORA_GGUF: "GGUF LoRA",
    OutputFormat.OLLAMA: "Ollama Modelfile",
    OutputFormat.MERGED: "merged model",
    OutputFormat.MLX: "MLX",
}
#: What each GGUF type is for, in the type picker.
QUANT_WORDS = {
    "Q4_K_M": "smallest that keeps quality (recommended)",
    "Q5_K_M": "a little larger, a little closer to the original",
    "Q6_K": "close to full quality",
    "Q8_0": "almost lossless, about twice Q4's size",
    "F16": "full 16-bit, the largest",
}
#: Room kept between a dialog fitted to its words and the screen's edges (the window frame and title bar).
SCREEN_ROOM = 60


def verdict_lines(verdicts: dict[OutputFormat, Verdict], formats: list[OutputFormat]) -> list[str]:
    """What can be made, then each reason once with the outputs it rules out: ``Cannot: GGUF, GGUF LoRA: why``."""
    possible = [FORMAT_WORDS[fmt] for fmt in formats if verdicts.get(fmt, Verdict(True)).possible]
    said = f"Can be made: {', '.join(possible)}." if possible else "Nothing can be made from this adapter and base."
    refused: dict[str, list[str]] = {}
    for fmt in formats:
        verdict = verdicts.get(fmt, Verdict(True))
        if not verdict.possible:
            refused.setdefault(people_words(verdict.reason), []).append(FORMAT_WORDS[fmt])
    return [said, *(f"Cannot: {', '.join(names)}: {reason}" for reason, names in refused.items())]


class _LocalStepDialog(QDialog):
    """What the export and compare dialogs share: a base model field, the needs panel and the two buttons.

    ``sig_install_tools``: the user chose to install the local tools first (the dialog has closed).
    """

    sig_install_tools = Signal()

    def __init__(self, parent: QWidget, adapter: ReturnedAdapter, secrets: SecretStore, title: str) -> None:
        super().__init__(parent)
        self.adapter, self.secrets = adapter, secrets
        self.needs: LocalNeeds | None = None
        self.setWindowTitle(title)
        self.setAccessibleName(title)
        self.setMinimumWidth(560)
        outer = QVBoxLayout(self)
        self.body_scroll = QScrollArea()  # on a short screen the questions scroll; none is squeezed out of sight
        self.body_scroll.setWidgetResizable(True)
        self.body_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self._body = body = QWidget()
        self.layout_ = QVBoxLayout(body)
        self.layout_.setContentsMargins(0, 0, 0, 0)
        self.layout_.setSpacing(12)
        self.body_scroll.setWidget(body)
        outer.addWidget(self.body_scroll, 1)
        self.buttons_row = QHBoxLayout()
        outer.addLayout(self.buttons_row)
        self.layout_.addWidget(heading(title))
        self.layout_.addWidget(caption(sentence(f"from {adapter_title(adapter)}")))

    def _finish_layout(self, start_text: str) -> None:
        self.layout_.addLayout(self._base_row())
        self.layout_.addWidget(heading("Before it starts"))
        self.needs_panel = NeedsPanel()
        self.needs_panel.sig_recheck.connect(self.refresh_needs)
        self.needs_panel.sig_install_tools.connect(self.on_install_tools)
        self.layout_.addWidget(self.needs_panel)
        self.hint_label = caption()
        self.hint_label.hide()
        self.layout_.addWidget(self.hint_label)
        self.layout_.addStretch(1)
        row = self.buttons_row
        row.addStretch(1)
        self.start_button = primary_button(start_text, "play")
        self.start_button.setDefault(True)
        self.start_button.clicked.connect(self.accept)
        cancel = plain_button("Cancel", accessible_name="Close without starting")
        cancel.clicked.connect(self.reject)
        row.addWidget(cancel)
        row.addWidget(self.start_button)
        self.refresh_needs()

    def showEvent(self, event: QShowEvent) -> None:
        """Opens as tall as its words need (up to the screen's height)."""
        super().showEvent(event)
        self.fit_to_words()

    def fit_to_words(self) -> None:
        """Makes the dialog as tall as its words now need, up to the screen's height; beyond that its body scrolls.

        A dialog does not grow by itself when wrapped words get longer after it opened (the reasons an output cannot
        be made): its questions were squeezed into an empty gap instead.
        """
        body = self._body
        width = self.body_scroll.viewport().width()
        needed = body.heightForWidth(width) if body.hasHeightForWidth() else body.sizeHint().height()
        around = self.height() - self.body_scroll.viewport().height()  # margins, the buttons
        screen = self.screen().availableGeometry()
        self.resize(self.width(), max(self.minimumHeight(), min(needed + around, screen.height() - SCREEN_ROOM)))
        frame = self.frameGeometry()
        if frame.bottom() > screen.bottom():  # grown past the screen's foot: up, so that its buttons show
            self.move(frame.x(), max(screen.top(), screen.bottom() - frame.height()))

    def _base_row(self) -> QFormLayout:
        form = QFormLayout()
        self.base_edit = QLineEdit(self.adapter.source.base or "")
        self.base_edit.setPlaceholderText("A model folder, or a Hugging Face id like Qwen/Qwen2.5-0.5B-Instruct")
        self.base_edit.setAccessibleName("Base model")
        self.base_edit.editingFinished.connect(self.refresh_needs)
        browse = plain_button("Choose &folder…", "folder-open", "Choose the base model's folder")
        browse.clicked.connect(lambda _checked=False: self.on_choose_base())
        row = QHBoxLayout()
        row.addWidget(self.base_edit, 1)
        row.addWidget(browse)
        label = QLabel("&Base model")
        label.setBuddy(self.base_edit)
        form.addRow(label, row)
        return form

    def on_install_tools(self) -> None:
        """Closes the dialog and asks for the local tools (the export or comparison is chosen again after)."""
        self.reject()
        self.sig_install_tools.emit()

    def base(self) -> str | None:
        """The base model entered: a folder or a Hub id."""
        return self.base_edit.text().strip() or None

    def on_choose_base(self) -> None:
        """Picks the base model's folder."""
        folder = QFileDialog.getExistingDirectory(self, "Choose the base model's folder", self.base() or "")
        if folder:
            self.base_edit.setText(folder)
            self.refresh_needs()

    #: The local steps chosen (each dialog says which).
    steps: Callable[[], list[LocalStep]]
    #: Why the choice cannot start, beyond what the needs panel says ("" when it can).
    problem: Callable[[], str]

    def refresh_needs(self) -> None:
        """Reads what the chosen steps need now, then asks the Hub for the base model's size when it must come."""
        needs = needs_now(self.steps(), self.base())
        self._show_needs(needs, asking=needs.base is not None and needs.base.hub_id is not None)
        if needs.base is not None and needs.base.hub_id is not None:
            steps, base = self.steps(), self.base()
            CoroutineOperation(
                self, lambda _job: local_needs(steps, base, self.secrets), self._show_needs, group="needs"
            ).run()

    def _show_needs(self, needs: LocalNeeds, *, asking: bool = False) -> None:
        self.needs = needs
        self.needs_panel.show_needs(needs, asking=asking)
        problem = self.problem()
        self.hint_label.setText(problem)
        self.hint_label.setVisible(bool(problem))
        self.start_button.setEnabled(needs.ready and not problem)
        if self.isVisible():
            self.fit_to_words()


class ExportDialog(_LocalStepDialog):
    """Asks what to export: merged, GGUF of a type, GGUF LoRA, MLX, an Ollama Modelfile; GGUF Q4_K_M is preset."""

    def __init__(self, parent: QWidget, adapter: ReturnedAdapter, secrets: SecretStore) -> None:
        self.verdicts: dict[OutputFormat, Verdict] = {}
        self._judged_base: str | None = None
        super().__init__(parent, adapter, secrets, "Export the fine-tuned model")
        self.layout_.addWidget(self._formats())
        self.verdict_label = caption("Checking which outputs can be made from this adapter and base…")
        self.verdict_label.setAccessibleName("Which outputs can be made")
        self.layout_.addWidget(self.verdict_label)
        self.layout_.addWidget(caption(f"Written to {adapter.export_folder}"))
        self._finish_layout("E&xport")

    def refresh_needs(self) -> None:
        """What the chosen outputs need, and (once per base) which outputs the converters would accept."""
        super().refresh_needs()
        base = self.base()
        if base and base != self._judged_base and hasattr(self, "verdict_label"):
            self._judged_base = base
            self.verdict_label.setText("Checking which outputs can be made from this adapter and base…")
            adapter = self.adapter.source.adapter

            async def judge(_job: object) -> dict[OutputFormat, Verdict]:
                return await judge_outputs(adapter, await base_description(base, secrets=self.secrets))

            CoroutineOperation(self, judge, self.show_verdicts, group="verdicts").failure(
                lambda exc: self.verdict_label.setText(f"Not checked yet: {people_words(str(exc))}"), LocalToolError
            ).run()

    def show_verdicts(self, verdicts: dict[OutputFormat, Verdict]) -> None:
        """Unticks and disables what cannot be made, saying why (each reason once); says what can."""
        self.verdicts = verdicts
        for fmt, checks in self._format_checks().items():
            verdict = verdicts.get(fmt, Verdict(True))
            for check in checks:
                check.setToolTip("" if verdict.possible else people_words(verdict.reason))
                check.setEnabled(verdict.possible)
                if not verdict.possible:
                    check.setChecked(False)
        self.verdict_label.setText("\n".join(verdict_lines(verdicts, list(self._format_checks()))))
        self.on_gguf_toggled(self.gguf_check.isChecked())
        self.refresh_needs()

    def _format_checks(self) -> dict[OutputFormat, list[QCheckBox]]:
        return {
            OutputFormat.GGUF: [self.gguf_check, *self.type_checks.values(), self.base_gguf_check],
            OutputFormat.LORA_GGUF: [self.lora_check],
            OutputFormat.OLLAMA: [self.ollama_check],
            OutputFormat.MERGED: [self.merged_check],
            OutputFormat.MLX: [self.mlx_check],
        }

    def _formats(self) -> QWidget:
        box = QWidget()
        grid = QGridLayout(box)
        grid.setContentsMargins(0, 0, 0, 0)
        self.gguf_check = self._check("&GGUF for llama.cpp, LM Studio and Ollama", True)
        self.type_checks = {qtype: self._type_check(qtype) for qtype in QUANT_TYPES}
        types = QGridLayout()
        types.setContentsMargins(24, 0, 0, 0)
        for index, check in enumerate(self.type_checks.values()):
            types.addWidget(check, index // 2, index % 2)
        self.base_gguf_check = self._check("The &base model as GGUF too, to compare the two side by side in Chat", True)
        self.gguf_check.toggled.connect(self.on_gguf_toggled)
        self.merged_check = self._check("&Merged model (16-bit safetensors, for Transformers and vLLM)")
        self.lora_check = self._check("GGUF &LoRA: the adapter alone, with the base model as GGUF beside it")
        self.ollama_check = self._check("&Ollama Modelfile (with the GGUF or the GGUF LoRA)")
        self.mlx_check = self._check("M&LX model, for Apple Silicon")
        grid.addWidget(self.gguf_check, 0, 0)
        grid.addLayout(types, 1, 0)
        base_row = QHBoxLayout()
        base_row.setContentsMargins(24, 0, 0, 0)
        base_row.addWidget(self.base_gguf_check)
        grid.addLayout(base_row, 2, 0)
        for row, check in enumerate((self.lora_check, self.ollama_check, self.merged_check, self.mlx_check), 3):
            grid.addWidget(check, row, 0)
        return box

    def _type_check(self, qtype: str) -> QCheckBox:
        check = self._check(f"{qtype}: {QUANT_SHORT[qtype]}", qtype == DEFAULT_GGUF)
        check.setAccessibleName(f"GGUF type {qtype}: {QUANT_WORDS[qtype]}")
        check.setToolTip(QUANT_WORDS[qtype])
        return check

    def on_gguf_toggled(self, on: bool) -> None:
        """The types and the base GGUF belong to the GGUF choice: shown enabled only with it."""
        possible = self.verdicts.get(OutputFormat.GGUF, Verdict(True)).possible
        for check in (*self.type_checks.values(), self.base_gguf_check):
            check.setEnabled(on and possible)

    def gguf_types(self) -> tuple[str, ...]:
        """The GGUF types ticked, smallest first (none when GGUF is not ticked)."""
        if not self.gguf_check.isChecked():
            return ()
        return tuple(qtype for qtype, check in self.type_checks.items() if check.isChecked())

    def _check(self, text: str, checked: bool = False) -> QCheckBox:
        check = QCheckBox(text)
        check.setChecked(checked)
        check.setAccessibleName(text.replace("&", ""))
        check.toggled.connect(lambda _on: self.refresh_needs())
        return check

    def steps(self) -> list[LocalStep]:
        """The steps of the outputs ticked."""
        ticked = [
            (self.merged_check, LocalStep.MERGE),
            (self.gguf_check, LocalStep.GGUF),
            (self.lora_check, LocalStep.LORA_GGUF),
            (self.ollama_check, LocalStep.OLLAMA),
            (self.mlx_check, LocalStep.MLX),
        ]
        return [step for check, step in ticked if check.isChecked()]

    def problem(self) -> str:
        """Nothing ticked, or a Modelfile without a GGUF to point at."""
        if not self.steps():
            return "Tick at least one thing to export."
        if self.gguf_check.isChecked() and not self.gguf_types():
            return "Tick at least one GGUF type, or untick GGUF."
        if self.ollama_check.isChecked() and not (self.gguf_check.isChecked() or self.lora_check.isChecked()):
            return "An Ollama Modelfile points at a GGUF: also tick GGUF or GGUF LoRA."
        return ""

    def request(self) -> ExportRequest:
        """The export as chosen."""
        return ExportRequest(
            adapter=self.adapter.source.adapter,
            base=self.base(),
            out=self.adapter.export_folder,
            merged=self.merged_check.isChecked(),
            gguf=self.gguf_types(),
            lora_gguf=self.lora_check.isChecked(),
            base_gguf=self.gguf_check.isChecked() and self.base_gguf_check.isChecked(),
            ollama=self.ollama_check.isChecked(),
            mlx=self.mlx_check.isChecked(),
        )


@dataclass(frozen=True)
class CompareChoice:
    """A comparison as chosen: base model, held-out chats, the user's own checks and how long it may take.

    Attributes:
        base: The base model (a folder or a Hub id).
        eval_file: The held-out chat file.
        max_examples: Rows compared at most.
        max_new_tokens: Longest answer per row.
        regex: A regular expression right answers match, or None.
        schema_file: A JSON Schema right JSON answers satisfy, or None.
        general: Also check general ability (lm-evaluation-harness on the shipped tasks).
    """

    base: str | None
    eval_file: Path
    max_examples: int
    max_new_tokens: int
    regex: str | None = None
    schema_file: Path | None = None
    general: bool = False


class CompareDialog(_LocalStepDialog):
    """Asks what to compare the base and the fine-tuned model on: the run's held-out chats, or a chosen file."""

    def __init__(self, parent: QWidget, adapter: ReturnedAdapter, secrets: SecretStore) -> None:
        super().__init__(parent, adapter, secrets, "Compare base and fine-tuned")
        self.layout_.addWidget(
            caption(
                "Both models answer each held-out chat; checks chosen from the expected answers (same answer, "
                "same label, or JSON with the same keys) score both, and the report names the rows the fine-tune "
                "fixed and broke, with each model's loss and what the run cost."
            )
        )
        self.layout_.addLayout(self._options())
        self._finish_layout("&Compare")

    def _options(self) -> QFormLayout:
        form = QFormLayout()
        eval_file = self.adapter.source.eval_file
        words = ("&Held-out chats", "held-out chats file", "A JSONL file of held-out chats")
        self.eval_edit = self._path_row(form, words, "Choose f&ile…", str(eval_file) if eval_file else "")
        self.examples_spin = _spin(1, 500, 20, "Chats compared at most", " chats")
        self.tokens_spin = _spin(8, 2048, 128, "Longest answer in tokens", " tokens")
        form.addRow("Compare &up to", self.examples_spin)
        form.addRow("Longest &answer", self.tokens_spin)
        self.regex_edit = QLineEdit()
        self.regex_edit.setPlaceholderText("Optional: a regular expression every right answer matches")
        self.regex_edit.setAccessibleName("Regular expression right answers match")
        self.regex_edit.textChanged.connect(lambda _text: self.refresh_needs())
        form.addRow("Right answers &match", self.regex_edit)
        words = ("JSON &Schema", "JSON Schema file", "Optional: a JSON Schema file right JSON answers satisfy")
        self.schema_edit = self._path_row(form, words, "Choose schema fil&e…")
        self.general_box = QCheckBox("Also check &general ability (arithmetic, world capitals)")
        self.general_box.setAccessibleName("Also check general ability with lm-evaluation-harness")
        self.general_box.setToolTip(
            "EleutherAI's lm-evaluation-harness on small tasks shipped with Rentune (offline): did the fine-tune lose "
            "what the base could do? Adds a few minutes on a laptop for a small model."
        )
        form.addRow("", self.general_box)
        return form

    def _path_row(self, form: QFormLayout, words: tuple[str, str, str], button: str, text: str = "") -> QLineEdit:
        """A file field with its Choose button; ``words`` are the label, what the file is and the placeholder."""
        label_text, name, placeholder = words
        edit = QLineEdit(text)
        edit.setPlaceholderText(placeholder)
        edit.setAccessibleName(name[:1].upper() + name[1:])
        edit.textChanged.connect(lambda _text: self.refresh_needs())
        browse = QPushButton(button)
        browse.setAccessibleName(f"Choose the {name}")
        browse.clicked.connect(lambda _checked=False: self.on_choose_file(edit, name))
        row = QHBoxLayout()
        row.addWidget(edit, 1)
        row.addWidget(browse)
        label = QLabel(label_text)
        label.setBuddy(edit)
        form.addRow(label, row)
        return edit

    def on_choose_file(self, edit: QLineEdit, name: str) -> None:
        """Picks the file for ``edit`` (held-out chats or a JSON Schema)."""
        kinds = "JSON Schema (*.json)" if edit is self.schema_edit else "Chat files (*.jsonl *.json)"
        path, _ = QFileDialog.getOpenFileName(self, f"Choose the {name}", "", kinds)
        if path:
            edit.setText(path)

    def steps(self) -> list[LocalStep]:
        """A comparison."""
        return [LocalStep.COMPARE]

    def problem(self) -> str:
        """No held-out chats file, or one that does not exist."""
        text = self.eval_edit.text().strip()
        if not text:
            return "Choose a file of held-out chats: this run kept none."
        if not Path(text).expanduser().is_file():
            return f"{text} does not exist: choose the held-out chats file."
        regex = self.regex_edit.text()
        if regex and (problem := regex_problem(regex)):
            return sentence(problem)
        schema = self.schema_edit.text().strip()
        if schema and not Path(schema).expanduser().is_file():
            return f"{schema} does not exist: choose the JSON Schema file, or clear the field."
        return ""

    def choice(self) -> CompareChoice:
        """The comparison as chosen."""
        return CompareChoice(
            self.base(),
            Path(self.eval_edit.text().strip()).expanduser(),
            self.examples_spin.value(),
            self.tokens_spin.value(),
            self.regex_edit.text() or None,
            Path(self.schema_edit.text().strip()).expanduser() if self.schema_edit.text().strip() else None,
            self.general_box.isChecked(),
        )


def _spin(low: int, high: int, value: int, name: str, suffix: str) -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(value)
    spin.setSuffix(suffix)
    spin.setAccessibleName(name)
    return spin
