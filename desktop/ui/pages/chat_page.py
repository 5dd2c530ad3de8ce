"""Chatting with a model on this computer: a GGUF (with an optional GGUF LoRA) or an MLX folder, streamed.

Side by side, two models answer the same message at once (the base and the fine-tuned model, say), each keeping its
own conversation. The models load in the background when picked (or on the first message); Stop ends the answers
at their next token, Clear forgets the conversations, Copy takes an answer. Enter sends, Shift+Enter starts a line.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop.services.local.chat_history import export_training_jsonl, load_history
from desktop.services.local.common import LocalToolError
from desktop.services.local.needs import needs_now
from desktop.services.local.tools import LocalStep
from desktop.services.runs.adapters import Inventory, read_inventory
from desktop.ui.background import CoroutineOperation, Job, Operation, Running
from desktop.ui.context import AppContext
from desktop.ui.pages.base import BasePage
from desktop.ui.widgets.blocks import Banner, Card, ContentColumn, plain_button, primary_button
from desktop.ui.widgets.chat_column import ChatColumn, ModelKey, Thread
from desktop.ui.widgets.local_words import people_words
from desktop.ui.widgets.model_picker import ModelPicker, origin_words
from desktop.ui.widgets.needs_panel import NeedsPanel
from desktop.ui.widgets.number_fields import CorrectionNote
from desktop.ui.widgets.prompt_edit import PromptEdit

NO_MODEL_YET = (
    "No model to chat with yet. Export a finished run's adapter as GGUF on the Models page, or browse for a GGUF "
    "file or an MLX folder above; the answers then appear here as the model writes them."
)
ANSWERS_APPEAR = "The answers appear here as the model writes them."
NO_BASE_EXPORTED = (
    'To compare with the base model, export the fine-tune on the Models page with "The base model as GGUF too" '
    "ticked, or browse for a GGUF of the base above."
)
#: Adding to a training file, not replacing it: the save dialog does not ask about overwriting.
_APPEND_OPTIONS = QFileDialog.Option.DontConfirmOverwrite
DEFAULT_TEMPERATURE = 0.7
DEFAULT_MAX_TOKENS = 512


def _label(text: str, buddy: QWidget) -> QLabel:
    label = QLabel(text)
    label.setBuddy(buddy)
    return label


def _note_under(box: QSpinBox | QDoubleSpinBox, name: str) -> CorrectionNote:
    """A note saying why the number typed into ``box`` was changed, its words ending under the box."""
    note = CorrectionNote()
    note.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop)
    note.watch(box, name)
    return note


class ChatPage(BasePage):
    """Two chat columns (the second one side by side on request) over one message field.

    Signals:
        sig_install_tools: The user asked to install the local tools (chat needs llama.cpp or MLX).
    """

    sig_install_tools = Signal()

    page_name = "chat"
    title = "Chat"
    icon_name = "message-square"
    scrolls = False
    purpose = (
        "Talk to a model on this computer. Side by side, the base and the fine-tuned model answer the same "
        "message, so you see what the fine-tune changed."
    )

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        self.context = context
        self.inventory = Inventory()
        self.answering: dict[int, Running[Any]] = {}
        self._second_chosen = False  # the user picked the second model (else it follows the first)
        super().__init__(parent)
        # the message field stays in view; above it, what a small window cannot hold scrolls (never squashed)
        self.upper = ContentColumn()
        self.upper.setAccessibleName("Models and conversations")
        self.banner = Banner()
        self.upper.body.addWidget(self.banner)
        self.needs_card = Card("Before you can chat")
        self.needs_panel = NeedsPanel()
        self.needs_panel.sig_recheck.connect(self._check_tools)
        self.needs_panel.sig_install_tools.connect(self.sig_install_tools)
        self.needs_card.body.addWidget(self.needs_panel)
        self.needs_card.hide()
        self.upper.body.addWidget(self.needs_card)
        self.upper.body.addWidget(self._build_setup())
        threads: dict[ModelKey, Thread] = {}  # a model's conversation is the same in either column
        self.columns = [ChatColumn("Model", threads), ChatColumn("Second model", threads)]
        row = QHBoxLayout()
        for column in self.columns:
            row.addWidget(column, 1)
            column.sig_changed.connect(self._set_buttons)
        self.columns[1].hide()
        self.upper.body.addLayout(row, 1)
        self.body.addWidget(self.upper, 1)
        self.body.addLayout(self._build_prompt())
        self._set_buttons()

    # -- layout -------------------------------------------------------------------------------------------------

    def _build_setup(self) -> Card:
        card = Card()
        card.setAccessibleName("Models and settings")
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        self.pickers = [ModelPicker("Model"), ModelPicker("Second model")]
        self.lora_pickers = [ModelPicker("LoRA", loras=True), ModelPicker("Second model's LoRA", loras=True)]
        texts = (("&Model", "&LoRA"), ("Second mo&del", "Its Lo&RA"))
        rows: list[list[QWidget]] = []
        for index, (model_text, lora_text) in enumerate(texts):
            model_label = _label(model_text, self.pickers[index].combo)
            lora_label = _label(lora_text, self.lora_pickers[index].combo)
            rows.append([model_label, self.pickers[index], lora_label, self.lora_pickers[index]])
            for column, widget in enumerate(rows[-1]):
                grid.addWidget(widget, index, column)
            self.pickers[index].sig_picked.connect(lambda i=index: self.on_user_picked(i))
            self.lora_pickers[index].sig_picked.connect(lambda i=index: self.on_user_picked(i))
        self._second_row = rows[1]
        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("Optional: how the model should behave (a system prompt)")
        self.system_edit.setAccessibleName("System prompt")
        grid.addWidget(_label("S&ystem prompt", self.system_edit), 2, 0)
        grid.addWidget(self.system_edit, 2, 1, 1, 3)
        grid.setColumnStretch(1, 3)
        grid.setColumnStretch(3, 1)
        card.body.addLayout(grid)
        card.body.addLayout(self._build_settings())
        for widget in self._second_row:
            widget.hide()
        return card

    def _build_settings(self) -> QGridLayout:
        """Side by side, the temperature and the longest answer; each number's correction is said under it."""
        self.side_check = QCheckBox("&Side by side with a second model")
        self.side_check.setAccessibleName("Side by side with a second model")
        self.side_check.toggled.connect(self.on_side_toggled)
        self.temperature_spin = QDoubleSpinBox()
        self.temperature_spin.setRange(0.0, 2.0)
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setValue(DEFAULT_TEMPERATURE)
        self.temperature_spin.setAccessibleName("Temperature (0 answers the same way every time)")
        self.temperature_spin.setToolTip("0 always picks the likeliest word: the same answer every time")
        self.tokens_spin = QSpinBox()
        self.tokens_spin.setRange(1, 8192)
        self.tokens_spin.setValue(DEFAULT_MAX_TOKENS)
        self.tokens_spin.setSuffix(" tokens")
        self.tokens_spin.setAccessibleName("Longest answer in tokens")
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(2)
        grid.addWidget(self.side_check, 0, 0)
        grid.setColumnStretch(0, 1)
        grid.addWidget(_label("&Temperature", self.temperature_spin), 0, 1)
        grid.addWidget(self.temperature_spin, 0, 2)
        grid.addWidget(_label("Longest &answer", self.tokens_spin), 0, 3)
        grid.addWidget(self.tokens_spin, 0, 4)
        self.temperature_note = _note_under(self.temperature_spin, "Temperature")
        self.tokens_note = _note_under(self.tokens_spin, "Longest answer")
        grid.addWidget(self.temperature_note, 1, 0, 1, 3)  # ends under the temperature
        grid.addWidget(self.tokens_note, 2, 0, 1, 5)  # ends under the longest answer
        return grid

    def _build_prompt(self) -> QVBoxLayout:
        """The conversation's actions above the message field; Send and Stop beside it."""
        self.prompt = PromptEdit()
        self.prompt.sig_send.connect(self.on_send)
        label = _label("M&essage", self.prompt)
        label.setAlignment(Qt.AlignmentFlag.AlignTop)
        self.send_button = primary_button("Se&nd", "play", "Send the message")
        self.stop_button = plain_button("St&op", "square", "Stop the answers")
        self.clear_button = plain_button("&Clear", "eraser", "Clear the conversation")
        self.again_button = plain_button("&Regenerate", "refresh-cw", "Answer the last message again")
        self.save_button = plain_button("Save as trainin&g data…", "file-text", "Add this chat to a JSONL file")
        for button, handler in (
            (self.send_button, self.on_send),
            (self.stop_button, self.on_stop),
            (self.clear_button, self.on_clear),
            (self.again_button, self.on_regenerate),
            (self.save_button, self.on_save_training),
        ):
            button.clicked.connect(lambda _checked=False, act=handler: act())
        actions = QHBoxLayout()
        actions.addStretch(1)
        for button in (self.again_button, self.save_button, self.clear_button):
            actions.addWidget(button)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(label)
        row.addWidget(self.prompt, 1)
        row.addLayout(buttons)
        column = QVBoxLayout()
        column.addLayout(actions)
        column.addLayout(row)
        return column

    # -- models -------------------------------------------------------------------------------------------------

    async def load(self) -> None:
        """Lists the exported models to pick from (off the UI thread)."""
        store = self.context.store
        await Operation(self, lambda _job: read_inventory(store), self.show_inventory, group="inventory").run().wait()

    def showEvent(self, event: QShowEvent) -> None:
        """Lists the models again when the page comes into view (an export may have finished meanwhile)."""
        super().showEvent(event)
        store = self.context.store
        Operation(self, lambda _job: read_inventory(store), self.show_inventory, group="inventory").run()

    def show_inventory(self, inventory: Inventory) -> None:
        """Offers the inventory's GGUF and MLX models, and its GGUF LoRAs."""
        self.inventory = inventory
        exports = inventory.all_exports()
        for picker in (*self.pickers, *self.lora_pickers):
            picker.set_items(exports)
        none_yet = not any(item.chat_engine for _, item in exports)
        self.columns[0].set_hint(NO_MODEL_YET if none_yet else ANSWERS_APPEAR)
        if self.side_check.isChecked() and not self._second_chosen and self.key(1) is None and not self.answering:
            self._pick_base_beside()  # the base exported beside the first model is listed now
            self.on_model_picked(1)
        self._describe()

    def key(self, index: int) -> ModelKey | None:
        """The model (and LoRA) chosen for column ``index``."""
        model = self.pickers[index].path()
        return (model, self.lora_pickers[index].path()) if model is not None else None

    def active(self) -> list[int]:
        """The columns in use: the first, and the second when side by side."""
        return [0, 1] if self.side_check.isChecked() else [0]

    def open_model(self, model: str, lora: str = "") -> None:
        """Chooses ``model`` (and ``lora``) for the first column and starts loading it."""
        self.pickers[0].set_path(Path(model))
        self.lora_pickers[0].set_path(Path(lora) if lora else None)
        self._forget_stale_banner()
        self.on_model_picked(0)

    def on_user_picked(self, index: int) -> None:
        """The user chose a model or LoRA for column ``index``."""
        self._second_chosen = self._second_chosen or index == 1
        self._forget_stale_banner()
        self.on_model_picked(index)

    def _forget_stale_banner(self) -> None:
        """Hides the banner: whatever it says is about the choice before (a missing model, a load, a saved chat)."""
        self.banner.show_message("info", "")

    def on_model_picked(self, index: int) -> None:
        """Shows the new choice and its conversation, and loads it in the background (not for a screenshot).

        With no model chosen, the model loaded before is freed.
        """
        self._describe()
        key = self.key(index)
        column = self.columns[index]
        if key is None and index not in self.answering:
            CoroutineOperation(self, lambda _job: column.unload(), group=f"load-{index}").run()
        if key is None or self.context.read_only or index in self.answering or not self._check_tools():
            return
        CoroutineOperation(self, lambda _job: column.ensure_loaded(key), group=f"load-{index}").failure(
            lambda exc: self._show_error(column, exc), LocalToolError
        ).run()

    def on_side_toggled(self, on: bool) -> None:
        """Shows the second column; it starts as the first model without its LoRA (the base)."""
        for widget in self._second_row:
            widget.setVisible(on)
        self.columns[1].setVisible(on)
        self._forget_stale_banner()
        if on and not self._second_chosen:
            self._pick_base_beside()
        if on:
            self.on_model_picked(1)
        else:  # the second model's memory is freed; it loads again when side by side is back on
            second = self.columns[1]
            CoroutineOperation(self, lambda _job: second.unload(), group="load-1").run()
        self._describe()

    def _pick_base_beside(self) -> None:
        """Puts the first model's base in the second column (none, and a hint, when the base was not exported).

        The base is the first model's own file without its LoRA, or the base GGUF exported beside it.
        """
        first = self.key(0)
        base = self._base_of(first) if first is not None else None
        self.pickers[1].set_path(base)
        self.lora_pickers[1].set_path(None)
        missing = first is not None and base is None
        self.columns[1].set_hint(NO_BASE_EXPORTED if missing else ANSWERS_APPEAR)

    def _base_of(self, key: ModelKey) -> Path | None:
        """The model to put beside ``key``: its own file without the LoRA, or the base GGUF exported beside it."""
        model, lora = key
        if lora is not None:
            return model
        bases = [item.path for _, item in self.inventory.all_exports() if item.of_base]
        return next((base for base in bases if base.parent == model.parent), None)

    def _describe(self) -> None:
        """Titles each column, and shows which model it uses (the adapter it came from) with its conversation."""
        exports = self.inventory.all_exports()
        origins = {item.path: origin_words(origin, item) for origin, item in exports}
        for index, column in enumerate(self.columns):
            key = self.key(index)
            if column.title_label is not None:
                column.title_label.setText(self._title(index, key))
            origin = origins.get(key[1] or key[0], "") if key is not None else ""  # a LoRA makes the fine-tune
            if column.choose(key, origin):
                self._read_saved_chat(column, key)

    def _title(self, index: int, key: ModelKey | None) -> str:
        """``Fine-tuned``, ``Base``, or the column's name when neither is known."""
        exports = [item for _, item in self.inventory.all_exports() if item.chat_engine is not None]
        if key is not None and (key[1] is not None or key[0] in {i.path for i in exports if not i.of_base}):
            return "Fine-tuned"
        bases = {item.path for item in exports if item.of_base}
        if key is not None and key[1] is None and (key[0] in bases or self._other_has_lora(index)):
            return "Base"
        return self.columns[index].name

    def _read_saved_chat(self, column: ChatColumn, key: ModelKey | None) -> None:
        """Brings back the conversation with ``key`` from an earlier session (read off the UI thread)."""
        if key is None:
            return
        Operation(
            self, lambda _job: load_history(*key), lambda saved: column.take_saved(key, saved), group=f"chat-of:{key}"
        ).run()

    def _other_has_lora(self, index: int) -> bool:
        other = self.key(1 - index)
        return self.side_check.isChecked() and other is not None and other[1] is not None

    def _check_tools(self) -> bool:
        """Shows what chatting with the chosen models needs when something is missing; True when ready."""
        steps = {LocalStep.CHAT_MLX if key[0].is_dir() else LocalStep.CHAT_GGUF for key in self._keys()}
        needs = needs_now(steps, None)
        if steps and not needs.ready:
            self.needs_panel.show_needs(needs)
        self.needs_card.setVisible(bool(steps) and not needs.ready)
        return not steps or needs.ready

    def _keys(self) -> list[ModelKey]:
        return [key for index in self.active() if (key := self.key(index)) is not None]

    # -- asking -------------------------------------------------------------------------------------------------

    def on_send(self) -> None:
        """Sends the message to every column in use; each answer streams into its column."""
        question = self.prompt.text().strip()
        if not question or self.answering:
            return
        if self.key(0) is None:
            self.banner.show_message("warning", "Choose a model first.", "Pick an exported model or browse for one.")
            return
        if 1 in self.active() and self.key(1) is None:
            self.banner.show_message("warning", "Choose the second model, or turn off Side by side.", NO_BASE_EXPORTED)
            return
        if 1 in self.active() and self.key(1) == self.key(0):
            self.banner.show_message("warning", "Both sides have the same model.", "Choose another second model.")
            return
        if not self._check_tools():
            return
        self.banner.show_message("info", "")
        self.prompt.clear()
        for index in self.active():
            self._ask(index, question)
        self._set_buttons()
        self.upper.ensureWidgetVisible(self.columns[0].transcript, 0, 0)  # a small window: the answers in view

    def on_regenerate(self) -> None:
        """Answers the last message again in every column in use (the new answers replace the old in the history)."""
        if self.answering:
            return
        questions = {index: self.columns[index].take_back() for index in self.active()}
        if not any(questions.values()):
            return
        self.banner.show_message("info", "")
        for index, question in questions.items():
            if question is not None:
                self._ask(index, question, again=True)
        self._set_buttons()

    def on_save_training(self) -> None:
        """Adds the first column's chat (the fine-tune's, side by side) to a JSONL file of training chats."""
        column = self.columns[0]
        if not column.conversation.turns:
            return
        start = str(Path.home() / "good-chats.jsonl")
        chosen, _filter = QFileDialog.getSaveFileName(
            self, "Add this chat to a training file", start, "Chat data (*.jsonl)", "", _APPEND_OPTIONS
        )
        if not chosen:
            return
        conversation, target = column.conversation, Path(chosen)

        def saved(path: Path) -> None:
            self.banner.show_message(
                "success",
                f"Added this chat to {path.name}.",
                f"{path}\nUse it as training data on the New fine-tune page (one chat per line).",
            )

        Operation(self, lambda _job: export_training_jsonl(conversation, target), saved, group="save").failure(
            lambda exc: self.banner.show_message("danger", "The chat was not saved.", people_words(str(exc))),
            OSError,
            ValueError,
        ).run()

    def _ask(self, index: int, question: str, *, again: bool = False) -> None:
        column, key = self.columns[index], self.key(index)
        assert key is not None
        system, temperature = self.system_edit.text().strip(), self.temperature_spin.value()
        tokens = self.tokens_spin.value()

        def work(_job: Job) -> Awaitable[str]:
            return column.answer(key, question, system=system, temperature=temperature, max_tokens=tokens, again=again)

        running = (
            CoroutineOperation(self, work, group=f"answer-{index}")
            .failure(lambda exc: self._show_error(column, exc), LocalToolError)
            .run()
        )
        self.answering[index] = running
        running.task.add_done_callback(lambda _task: self._answered(index, running))

    def _answered(self, index: int, running: Running[Any]) -> None:
        if self.answering.get(index) is running:
            del self.answering[index]
        self._set_buttons()

    def _show_error(self, column: ChatColumn, exc: Exception) -> None:
        title = column.title_label.text() if column.title_label else column.name
        what = "the model did not load" if column.model is None else "no answer"
        self.banner.show_message("danger", f"{title}: {what}.", people_words(str(exc)))

    def on_stop(self) -> None:
        """Stops every answer being written (each keeps what it wrote so far)."""
        for running in list(self.answering.values()):
            running.cancel()

    def on_clear(self) -> None:
        """Stops the answers and forgets both conversations."""
        self.on_stop()
        for index, column in enumerate(self.columns):
            column.clear(self.key(index))
        self.banner.show_message("info", "")
        self._set_buttons()

    def _set_buttons(self) -> None:
        busy = bool(self.answering)
        answered = bool(self.columns[0].conversation.turns)
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.again_button.setEnabled(not busy and answered)
        self.save_button.setEnabled(not busy and answered)
        for picker in (*self.pickers, *self.lora_pickers):
            picker.setEnabled(not busy)
        self.side_check.setEnabled(not busy)

    async def close_models(self) -> None:
        """Stops the answers and frees both models (the app is closing, or a test ends)."""
        self.on_stop()
        for column in self.columns:
            await column.unload()
