"""One model's side of the chat: which model it is, whether it is ready, the conversation, and Copy.

It loads its model in the background (:func:`desktop.services.local.chat.open_chat`), streams each answer into the
transcript piece by piece as the model writes it, then shows it as Markdown (code blocks in a fixed-width font) with
its speed, the time to its first token and a Copy link of its own. It keeps its own history (:class:`Conversation`),
saved per model after each answer and brought back when the model is chosen again. Cancelling an answer's task stops
the generation at its next token; what was written so far stays and is remembered.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import shiboken6
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QTextBrowser, QWidget

from desktop.services.local.chat import ChatModel, Conversation, open_chat
from desktop.services.local.chat_history import forget_history, load_history, save_history
from desktop.services.local.common import LocalToolError, folder_bytes
from desktop.ui.theme import current_palette
from desktop.ui.widgets.blocks import Badge, Card, caption, plain_button
from desktop.ui.widgets.local_words import people_words, size_text

#: A model's files and the LoRA over them, as loaded.
ModelKey = tuple[Path, Path | None]
_COPY = "copy:"


@dataclass(frozen=True)
class AnswerSpeed:
    """How fast an answer came.

    Attributes:
        tokens: Pieces the model wrote (one token each, for llama.cpp and MLX).
        first_seconds: From asking to the first token (the prompt's processing).
        seconds: From asking to the last token.
    """

    tokens: int
    first_seconds: float
    seconds: float

    def words(self) -> str:
        """``24 tokens · 31.5 tokens/s · first after 0.18 s``."""
        writing = self.seconds - self.first_seconds
        rate = f" · {(self.tokens - 1) / writing:.1f} tokens/s" if self.tokens > 1 and writing > 0 else ""
        noun = "token" if self.tokens == 1 else "tokens"
        return f"{self.tokens} {noun}{rate} · first after {self.first_seconds:.2f} s"


class ChatColumn(Card):
    """A transcript with the model's name and state above it and Copy below.

    Args:
        title: The column's name ("Model", "Second model").
    """

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(title, parent=parent)
        self.name = title
        self.model: ChatModel | None = None
        self.loaded: ModelKey | None = None
        self.conversation = Conversation()
        self.answers: list[str] = []
        self.speeds: list[AnswerSpeed] = []
        self._saving: set[asyncio.Task[object]] = set()
        self._loading: asyncio.Future[ChatModel] | None = None
        self._loading_key: ModelKey | None = None
        self._failed_key: ModelKey | None = None
        self.badge = Badge("No model", "info")
        self.add_header_widget(self.badge)
        self.model_label = caption("Choose a model above.")
        self.model_label.setAccessibleName(f"{title}: which model")
        self.body.addWidget(self.model_label)
        self.busy_bar = QProgressBar()
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setTextVisible(False)
        self.busy_bar.setAccessibleName(f"{title}: loading")
        self.busy_bar.hide()
        self.body.addWidget(self.busy_bar)
        self.transcript = QTextBrowser()
        self.transcript.setAccessibleName(f"{title}: conversation")
        self.transcript.setOpenLinks(False)
        self.transcript.anchorClicked.connect(self.on_link)
        self.transcript.setTabChangesFocus(True)
        self.hint_label = caption("The answers appear here as the model writes them.")
        self.hint_label.setAccessibleName(f"{title}: what to do first")
        self.body.addWidget(self.hint_label)
        self.body.addWidget(self.transcript, 1)
        self.transcript.textChanged.connect(self._show_hint)
        self.body.addLayout(self._footer())

    def _footer(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.copy_button = plain_button("Copy answer", "copy", f"{self.name}: copy the last answer")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(lambda _checked=False: self.copy_answer())
        row.addStretch(1)
        row.addWidget(self.copy_button)
        return row

    def set_hint(self, text: str) -> None:
        """What the empty transcript should say (a line that wraps, unlike a placeholder); hidden once it has text."""
        self.hint_label.setText(text)
        self._show_hint()

    def _show_hint(self) -> None:
        self.hint_label.setVisible(self.transcript.document().isEmpty() and bool(self.hint_label.text()))

    # -- the model ----------------------------------------------------------------------------------------------

    def describe(self, key: ModelKey | None) -> None:
        """Says which model the column will use (before it is loaded)."""
        if key is None:
            self.model_label.setText("Choose a model above.")
            return
        model, lora = key
        words = f"{model.name} ({size_text(_size(model))})"
        self.model_label.setText(f"{words} with the LoRA {lora.name}" if lora else words)
        loading = self._loading is not None and key == self._loading_key
        if key not in (self.loaded, self._failed_key) and not loading:
            self.badge.show_state("Not loaded", "info")

    async def ensure_loaded(self, key: ModelKey) -> ChatModel:
        """The column's model for ``key``, loading it in the background when another or none is loaded.

        A load already under way for ``key`` is joined, not repeated; cancelling the caller leaves it going.

        Raises:
            LocalToolError: The files are missing, do not fit each other, or do not load; the badge says so.
        """
        if self.model is not None and self.loaded == key:
            return self.model
        if self._loading is None or self._loading_key != key:
            await self.unload()
            self._loading_key = key
            self._loading = asyncio.ensure_future(self._load(key))
            self._loading.add_done_callback(_retrieve)
        return await asyncio.shield(self._loading)

    async def _load(self, key: ModelKey) -> ChatModel:
        self.describe(key)
        self.badge.show_state("Loading…", "info")
        self.busy_bar.show()
        model, lora = key
        try:
            loaded = await open_chat(model, lora=lora)
        except LocalToolError:
            if self._loading is asyncio.current_task():
                self._failed_key = key
                self.badge.show_state("Could not load", "danger")
            raise
        finally:
            if self._loading is asyncio.current_task():  # not a load abandoned for a newer one
                self._loading = None
                self.busy_bar.hide()
        self.model, self.loaded, self._failed_key = loaded, key, None
        self.badge.show_state("Ready", "success")
        if not self.conversation.turns and self.transcript.document().isEmpty():
            saved = await asyncio.to_thread(load_history, *key)
            # a question asked while the model loaded starts a new conversation: its lines are never wiped
            gone = not shiboken6.isValid(self)  # the window closed while the file was read
            if saved is not None and not gone and not self.conversation.turns and self.transcript.document().isEmpty():
                self.show_saved(saved)
        return loaded

    async def unload(self) -> None:
        """Frees the loaded model, if any (a load in progress is abandoned)."""
        if self._loading is not None:
            self._loading.cancel()
            self._loading = None
            self.busy_bar.hide()
        model, self.model, self.loaded = self.model, None, None
        if model is not None:
            await model.close()
        if shiboken6.isValid(self.badge):  # the window may have closed meanwhile
            self.badge.show_state("No model", "info")

    # -- answering ----------------------------------------------------------------------------------------------

    async def answer(
        self, key: ModelKey, question: str, *, system: str, temperature: float, max_tokens: int, again: bool = False
    ) -> str:
        """Shows ``question`` (not when answering it ``again``), then streams the answer; returns the answer.

        A cancel (Stop) keeps the part already written, marked as stopped, and remembers it as the answer.

        Raises:
            LocalToolError: The model does not load, or generating failed (shown in the transcript too).
        """
        if not again:
            self._write_turn("You", question)
        try:
            model = await self.ensure_loaded(key)
        except asyncio.CancelledError:
            self._write_note("(stopped before the model was loaded)")
            raise
        self.conversation.system = system or None
        title = self.title_label.text() if self.title_label else self.name
        self._write_heading(f"{title} · answered again" if again else title)
        self.badge.show_state("Answering…", "info")
        start, asked = self._cursor().position(), time.monotonic()
        pieces: list[str] = []
        first, remembered = 0.0, False
        try:
            messages = self.conversation.with_question(question)
            async for piece in model.stream(messages, temperature=temperature, max_tokens=max_tokens):
                first = first or time.monotonic() - asked
                pieces.append(piece)
                self._write_text(piece)
        except asyncio.CancelledError:
            remembered = self._remember(question, "".join(pieces), key)
            self._end_answer(start, pieces, AnswerSpeed(len(pieces), first, time.monotonic() - asked), "(stopped)")
            raise
        except LocalToolError as exc:
            self._write_note(people_words(str(exc)))
            raise
        finally:
            if not remembered:
                self._remember(question, "".join(pieces), key)
        if not pieces:
            self._write_note("(no answer: the model ended its turn at once)")
        else:
            self._end_answer(start, pieces, AnswerSpeed(len(pieces), first, time.monotonic() - asked))
        return "".join(pieces)

    def _end_answer(self, start: int, pieces: list[str], speed: AnswerSpeed, note: str = "") -> None:
        """Shows the streamed answer as Markdown, then its speed and a Copy link of its own."""
        if not pieces:
            self._write_note(note or "(no answer)")
            return
        self._render_markdown(start, "".join(pieces))
        self.speeds.append(speed)
        self._write_footer(len(self.answers), f"{note} {speed.words()}".strip())

    def _remember(self, question: str, answer: str, key: ModelKey) -> bool:
        """Adds the exchange to the conversation (and saves it) when something was answered; True once done."""
        if answer:  # an answer stopped before its first word leaves no turn in the history
            self.conversation.record(question, answer)
            self.answers.append(answer)
            self._save(key)
        self.copy_button.setEnabled(bool(self.answers))
        if self.model is not None:
            self.badge.show_state("Ready", "success")
        return True

    def _save(self, key: ModelKey) -> None:
        """Saves the conversation with this model in the background (kept until the save is done)."""
        snapshot = Conversation(self.conversation.system, list(self.conversation.turns))
        self._on_disk(lambda: save_history(key[0], key[1], snapshot), "this chat could not be saved")

    def _on_disk(self, work: Callable[[], object], failed: str) -> None:
        """Runs a small file change off the event loop, kept until done; a failure is said in the transcript."""
        task: asyncio.Task[object] = asyncio.ensure_future(asyncio.to_thread(work))
        self._saving.add(task)

        def done(finished: asyncio.Task[object]) -> None:
            self._saving.discard(finished)
            if not finished.cancelled() and finished.exception() is not None and shiboken6.isValid(self):
                self._write_note(f"({failed}: {finished.exception()})")

        task.add_done_callback(done)

    def take_back(self) -> str | None:
        """Forgets the last exchange to answer it again; returns its question (None when there is none)."""
        question = self.conversation.take_back()
        if question is not None and self.answers:
            self.answers.pop()
        return question

    def show_saved(self, conversation: Conversation) -> None:
        """Shows a saved conversation, and takes it up: the next question continues it."""
        self.clear_view()
        self.conversation = conversation
        title = self.title_label.text() if self.title_label else self.name
        for index in range(0, len(conversation.turns), 2):
            question, answer = conversation.turns[index]["content"], conversation.turns[index + 1]["content"]
            self._write_turn("You", question)
            self._write_heading(title)
            start = self._cursor().position()
            self._write_text(answer)
            self._render_markdown(start, answer)
            self.answers.append(answer)
            self._write_footer(len(self.answers), "(from your last session)")
        self.copy_button.setEnabled(bool(self.answers))

    def last_answer(self) -> str:
        """The latest answer (possibly stopped part-way), or ""."""
        return self.answers[-1] if self.answers else ""

    def copy_answer(self, index: int | None = None) -> None:
        """Puts an answer on the clipboard: the one numbered ``index`` (from 1), or the latest."""
        answer = self.answers[index - 1] if index is not None and 0 < index <= len(self.answers) else None
        QGuiApplication.clipboard().setText(answer if answer is not None else self.last_answer())

    def on_link(self, url: QUrl) -> None:
        """A Copy link under an answer: copies that answer."""
        text = url.toString()
        if text.startswith(_COPY) and text[len(_COPY) :].isdigit():
            self.copy_answer(int(text[len(_COPY) :]))

    def clear(self, key: ModelKey | None = None) -> None:
        """Forgets the conversation (and its saved copy for ``key``) and empties the transcript; the model stays."""
        self.clear_view()
        self.conversation = Conversation(self.conversation.system)
        if key is not None:
            self._on_disk(lambda: forget_history(*key), "the saved chat could not be deleted")

    def clear_view(self) -> None:
        """Empties the transcript and the answers shown (the conversation itself is kept)."""
        self.answers.clear()
        self.speeds.clear()
        self.transcript.clear()
        self.copy_button.setEnabled(False)

    def text(self) -> str:
        """The transcript as plain text."""
        return self.transcript.toPlainText()

    # -- the transcript -----------------------------------------------------------------------------------------

    def _cursor(self) -> QTextCursor:
        cursor = self.transcript.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def _write_heading(self, who: str) -> None:
        cursor = self._cursor()
        if not self.transcript.document().isEmpty():
            spaced = QTextBlockFormat()
            spaced.setTopMargin(10 if who == "You" else 4)  # a turn starts a little apart from the last one
            cursor.insertBlock(spaced)
        color = current_palette().accent if who == "You" else current_palette().text_muted
        cursor.insertHtml(f'<b style="color:{color}">{html.escape(who)}</b>')
        cursor.insertBlock(QTextBlockFormat())
        self.transcript.setTextCursor(cursor)

    def _write_turn(self, who: str, text: str) -> None:
        self._write_heading(who)
        self._write_text(text)

    def _write_text(self, text: str) -> None:
        cursor = self._cursor()
        cursor.setCharFormat(QTextCharFormat())
        cursor.insertText(text)
        self.transcript.setTextCursor(cursor)
        self.transcript.ensureCursorVisible()

    def _render_markdown(self, start: int, text: str) -> None:
        """Replaces the plain text from ``start`` to the end with ``text`` rendered as Markdown."""
        cursor = self._cursor()
        cursor.setPosition(start, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setCharFormat(QTextCharFormat())
        cursor.insertMarkdown(text)
        self.transcript.setTextCursor(cursor)
        self.transcript.ensureCursorVisible()

    def _write_footer(self, index: int, words: str) -> None:
        cursor = self._cursor()
        cursor.insertBlock(QTextBlockFormat())
        color = current_palette().text_muted
        cursor.insertHtml(
            f'<span style="color:{color}; font-size:small">{html.escape(words)} · </span>'
            f'<a href="{_COPY}{index}" style="font-size:small">Copy</a>'
        )
        cursor.setCharFormat(QTextCharFormat())
        self.transcript.setTextCursor(cursor)
        self.transcript.ensureCursorVisible()

    def _write_note(self, text: str) -> None:
        cursor = self._cursor()
        color = current_palette().text_muted
        cursor.insertHtml(f' <i style="color:{color}">{html.escape(text)}</i>')
        self.transcript.setTextCursor(cursor)


def _retrieve(future: asyncio.Future[ChatModel]) -> None:
    """Marks a load's failure as seen: the caller that awaited it reported it, or no one is waiting any more."""
    if not future.cancelled():
        future.exception()


def _size(path: Path) -> int | None:
    try:
        return folder_bytes(path)
    except OSError:
        return None
