"""One model's side of the chat: which model it is, whether it is ready, the conversation, and Copy.

It loads its model in the background (:func:`desktop.services.local.chat.open_chat`), streams each answer into the
transcript piece by piece as the model writes it, then shows it as Markdown (code blocks in a fixed-width font) with
its speed, the time to its first token and a Copy link of its own. Each model has a conversation of its own
(:class:`Thread`): choosing another model shows that model's conversation, and a question goes to the chosen model
with its own history only. Each is saved per model after each answer and brought back when the model is chosen again
(also after a restart). Cancelling an answer's task stops the generation at its next token; what was written so far
stays and is remembered.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import shiboken6
from PySide6.QtCore import QSize, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QGuiApplication,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import QProgressBar, QTextBrowser, QWidget

from desktop.services.local.chat import ChatModel, Conversation, open_chat
from desktop.services.local.chat_history import forget_history, save_history
from desktop.services.local.common import LocalToolError, folder_bytes
from desktop.ui.design.palette import Palette
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.blocks import Badge, Card, caption, plain_button
from desktop.ui.widgets.local_words import people_words, size_text

#: A model's files and the LoRA over them, as loaded.
ModelKey = tuple[Path, Path | None]
_COPY = "copy:"
#: The fewest lines of conversation a column shows, however small the window (the page scrolls instead).
MIN_TRANSCRIPT_LINES = 6


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


class Transcript(QTextBrowser):
    """A conversation's transcript: as tall as the column allows, asking for no more than its fewest lines.

    The page scrolls in a small window; asking for those lines only lets it shrink the transcripts to them before it
    scrolls (a scroll area gives its content the height the content asks for).
    """

    def sizeHint(self) -> QSize:
        """The usual width, and the least height."""
        return QSize(super().sizeHint().width(), self.minimumHeight())


@dataclass
class Thread:
    """One model's conversation in a column: its history, the answers as shown, and its own transcript.

    Attributes:
        conversation: The history the model is asked with (only this model's turns).
        document: The transcript of this conversation, shown while the model is chosen.
        answers: The answers shown, oldest first (Copy takes them).
        speeds: How fast each answer shown in this session came.
    """

    conversation: Conversation
    document: QTextDocument
    answers: list[str] = field(default_factory=list)
    speeds: list[AnswerSpeed] = field(default_factory=list)


class ChatColumn(Card):
    """A transcript with the model's name and state above it and Copy beside them.

    Each model (a file, with its LoRA if any) has a conversation of its own: choosing a model shows its conversation
    (:meth:`choose`) and the next question continues that one only.

    Signals:
        sig_changed: The conversation shown changed (another model chosen, a saved chat shown, cleared).

    Args:
        title: The column's name ("Model", "Second model").
        threads: The conversations by model, shared by the columns of a page (a model's conversation is the same
            whichever column shows it); the column's own when None.
    """

    sig_changed = Signal()

    def __init__(
        self, title: str, threads: dict[ModelKey, Thread] | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(title, parent=parent)
        self.name = title
        self.model: ChatModel | None = None
        self.loaded: ModelKey | None = None
        self.chosen: ModelKey | None = None
        self._saving: set[asyncio.Task[object]] = set()
        self._loading: asyncio.Future[ChatModel] | None = None
        self._loading_key: ModelKey | None = None
        self._failed_key: ModelKey | None = None
        self._answering_key: ModelKey | None = None
        self.copy_button = plain_button("Copy answer", "copy", f"{self.name}: copy the last answer")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(lambda _checked=False: self.copy_answer())
        self.badge = Badge("No model", "info")
        self.add_header_widget(self.badge)
        self.add_header_widget(self.copy_button)  # at the far right: it stays put while the badge's words change
        self.model_label = caption("Choose a model above.")
        self.model_label.setAccessibleName(f"{title}: which model")
        self.body.addWidget(self.model_label)
        self.busy_bar = QProgressBar()
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setTextVisible(False)
        self.busy_bar.setAccessibleName(f"{title}: loading")
        self.busy_bar.hide()
        self.body.addWidget(self.busy_bar)
        self.transcript = Transcript()
        self.transcript.setAccessibleName(f"{title}: conversation")
        self.transcript.setOpenLinks(False)
        self.transcript.anchorClicked.connect(self.on_link)
        self.transcript.setTabChangesFocus(True)
        lines = self.transcript.fontMetrics().lineSpacing()
        self.transcript.setMinimumHeight(MIN_TRANSCRIPT_LINES * lines + 2 * self.transcript.frameWidth() + 8)
        self._font = self.transcript.document().defaultFont()
        self._threads: dict[ModelKey, Thread] = {} if threads is None else threads
        self._unchosen = self._new_thread()
        self.transcript.setDocument(self._unchosen.document)
        self.hint_label = caption("The answers appear here as the model writes them.")
        self.hint_label.setAccessibleName(f"{title}: what to do first")
        self.body.addWidget(self.hint_label)
        self.body.addWidget(self.transcript, 1)
        self.transcript.textChanged.connect(self._show_hint)
        self._palette = current_palette()  # the colours the transcripts are written in
        theme_events().sig_changed.connect(self.on_theme_changed)

    def on_theme_changed(self, palette: Palette) -> None:
        """Redraws the names, notes and links of every conversation in ``palette`` (they were written in colour)."""
        for thread in [self._unchosen, *self._threads.values()]:
            recolour(thread.document, self._palette, palette)
        self._palette = palette

    def set_hint(self, text: str) -> None:
        """What the empty transcript should say (a line that wraps, unlike a placeholder); hidden once it has text."""
        self.hint_label.setText(text)
        self._show_hint()

    def _show_hint(self) -> None:
        self.hint_label.setVisible(self.transcript.document().isEmpty() and bool(self.hint_label.text()))

    # -- the conversation of each model -------------------------------------------------------------------------

    def _new_thread(self) -> Thread:
        document = QTextDocument(self)  # the column keeps it: the transcript deletes only documents it made
        document.setDefaultFont(self._font)
        return Thread(Conversation(), document)

    def thread_of(self, key: ModelKey | None) -> Thread:
        """The conversation with ``key`` (an empty one, never shown elsewhere, when ``key`` is None)."""
        if key is None:
            return self._unchosen
        if key not in self._threads:
            self._threads[key] = self._new_thread()
        return self._threads[key]

    @property
    def shown(self) -> Thread:
        """The conversation of the model chosen now."""
        return self.thread_of(self.chosen)

    @property
    def conversation(self) -> Conversation:
        """The history of the model chosen now."""
        return self.shown.conversation

    @property
    def answers(self) -> list[str]:
        """The answers of the model chosen now, oldest first."""
        return self.shown.answers

    @property
    def speeds(self) -> list[AnswerSpeed]:
        """How fast the answers of the model chosen now came (this session's)."""
        return self.shown.speeds

    def choose(self, key: ModelKey | None, origin: str = "") -> bool:
        """Shows which model ``key`` is (``origin``: the adapter it came from) and its conversation; none for None.

        Returns:
            True when ``key``'s saved conversation has not been looked for yet: the caller reads it
            (:func:`load_history`, off the UI thread) and hands it to :meth:`take_saved`.
        """
        new = key is not None and key not in self._threads
        self.chosen = key
        self._describe(key, origin)
        document = self.shown.document
        if self.transcript.document() is not document:
            self.transcript.setDocument(document)
            self._show_end()
            self._show_hint()
            self.copy_button.setEnabled(bool(self.answers))
            self.sig_changed.emit()
        return new

    def _show_end(self) -> None:
        """Scrolls to the conversation's end, now and once the column has its new size (a column just shown)."""
        self.transcript.moveCursor(QTextCursor.MoveOperation.End)
        QTimer.singleShot(0, self._end_in_view)

    def _end_in_view(self) -> None:
        if shiboken6.isValid(self):  # the window may have closed meanwhile
            self.transcript.ensureCursorVisible()

    def take_saved(self, key: ModelKey, saved: Conversation | None) -> None:
        """Shows ``saved``, the conversation with ``key`` from an earlier session, unless one was started since."""
        thread = self.thread_of(key)
        if saved is None or thread.conversation.turns or not thread.document.isEmpty():
            return  # a question asked meanwhile starts a new conversation: its lines are never wiped
        self.show_saved(saved, key)

    # -- the model ----------------------------------------------------------------------------------------------

    def _describe(self, key: ModelKey | None, origin: str) -> None:
        """Says which model the column uses (and the adapter it came from) and whether it is ready."""
        if key is None:
            self.model_label.setText("Choose a model above.")
        else:
            model, lora = key
            words = f"{model.name} ({size_text(_size(model))})"
            words = f"{words} with the LoRA {lora.name}" if lora else words
            self.model_label.setText(f"{words} · {origin}" if origin else words)
        self.model_label.setToolTip(self.model_label.text())
        self._show_state()

    def _show_state(self) -> None:
        """The badge: whether the chosen model is loaded, loading, answering, or could not load."""
        key = self.chosen
        if key is None:
            self.badge.show_state("No model", "info")
        elif key == self._answering_key:
            self.badge.show_state("Answering…", "info")
        elif self._loading is not None and key == self._loading_key:
            self.badge.show_state("Loading…", "info")
        elif key == self.loaded and self.model is not None:
            self.badge.show_state("Ready", "success")
        elif key == self._failed_key:
            self.badge.show_state("Could not load", "danger")
        else:
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
        self._show_state()
        self.busy_bar.show()
        model, lora = key
        try:
            loaded = await open_chat(model, lora=lora)
        except LocalToolError:
            if self._loading is asyncio.current_task():
                self._failed_key = key
            raise
        finally:
            if self._loading is asyncio.current_task():  # not a load abandoned for a newer one
                self._loading = None
                self.busy_bar.hide()
                if shiboken6.isValid(self):  # the window may have closed meanwhile
                    self._show_state()
        self.model, self.loaded, self._failed_key = loaded, key, None
        self._show_state()
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
            self._show_state()

    # -- answering ----------------------------------------------------------------------------------------------

    async def answer(
        self, key: ModelKey, question: str, *, system: str, temperature: float, max_tokens: int, again: bool = False
    ) -> str:
        """Shows ``question`` (not when answering it ``again``), then streams the answer; returns the answer.

        The question goes to ``key``'s model with ``key``'s conversation only, and the exchange joins that one.
        A cancel (Stop) keeps the part already written, marked as stopped, and remembers it as the answer.

        Raises:
            LocalToolError: The model does not load, or generating failed (shown in the transcript too).
        """
        thread = self.thread_of(key)
        if not again:
            self._write_turn(thread, "You", question)
        try:
            model = await self.ensure_loaded(key)
        except asyncio.CancelledError:
            self._write_note(thread, "(stopped before the model was loaded)")
            raise
        thread.conversation.system = system or None
        title = self.title_label.text() if self.title_label else self.name
        self._write_heading(thread, f"{title} · answered again" if again else title)
        self._answering_key = key
        self._show_state()
        start, asked = _end(thread).position(), time.monotonic()
        pieces: list[str] = []
        first, remembered = 0.0, False
        try:
            messages = thread.conversation.with_question(question)
            async for piece in model.stream(messages, temperature=temperature, max_tokens=max_tokens):
                first = first or time.monotonic() - asked
                pieces.append(piece)
                self._write_text(thread, piece)
        except asyncio.CancelledError:
            remembered = self._remember(thread, question, "".join(pieces), key)
            speed = AnswerSpeed(len(pieces), first, time.monotonic() - asked)
            self._end_answer(thread, start, pieces, speed, "(stopped)")
            raise
        except LocalToolError as exc:
            self._write_note(thread, people_words(str(exc)))
            raise
        finally:
            if not remembered:
                self._remember(thread, question, "".join(pieces), key)
        if not pieces:
            self._write_note(thread, "(no answer: the model ended its turn at once)")
        else:
            self._end_answer(thread, start, pieces, AnswerSpeed(len(pieces), first, time.monotonic() - asked))
        return "".join(pieces)

    def _end_answer(self, thread: Thread, start: int, pieces: list[str], speed: AnswerSpeed, note: str = "") -> None:
        """Shows the streamed answer as Markdown, then its speed and a Copy link of its own."""
        if not pieces:
            self._write_note(thread, note or "(no answer)")
            return
        self._render_markdown(thread, start, "".join(pieces))
        thread.speeds.append(speed)
        self._write_footer(thread, len(thread.answers), f"{note} {speed.words()}".strip())

    def _remember(self, thread: Thread, question: str, answer: str, key: ModelKey) -> bool:
        """Adds the exchange to the conversation (and saves it) when something was answered; True once done."""
        if answer:  # an answer stopped before its first word leaves no turn in the history
            thread.conversation.record(question, answer)
            thread.answers.append(answer)
            self._save(thread, key)
        self._answering_key = None
        if shiboken6.isValid(self):  # the window may have closed meanwhile
            self.copy_button.setEnabled(bool(self.answers))
            self._show_state()
        return True

    def _save(self, thread: Thread, key: ModelKey) -> None:
        """Saves the conversation with this model in the background (kept until the save is done)."""
        snapshot = Conversation(thread.conversation.system, list(thread.conversation.turns))
        self._on_disk(thread, lambda: save_history(key[0], key[1], snapshot), "this chat could not be saved")

    def _on_disk(self, thread: Thread, work: Callable[[], object], failed: str) -> None:
        """Runs a small file change off the event loop, kept until done; a failure is said in the transcript."""
        task: asyncio.Task[object] = asyncio.ensure_future(asyncio.to_thread(work))
        self._saving.add(task)

        def done(finished: asyncio.Task[object]) -> None:
            self._saving.discard(finished)
            if not finished.cancelled() and finished.exception() is not None and shiboken6.isValid(self):
                self._write_note(thread, f"({failed}: {finished.exception()})")

        task.add_done_callback(done)

    def take_back(self) -> str | None:
        """Forgets the last exchange to answer it again; returns its question (None when there is none)."""
        question = self.conversation.take_back()
        if question is not None and self.answers:
            self.answers.pop()
        return question

    def show_saved(self, conversation: Conversation, key: ModelKey | None = None) -> None:
        """Shows a saved conversation with ``key`` (the model chosen now by default) and takes it up.

        The next question to that model continues it.
        """
        thread = self.thread_of(self.chosen if key is None else key)
        self._clear_thread(thread)
        thread.conversation = conversation
        title = self.title_label.text() if self.title_label else self.name
        for index in range(0, len(conversation.turns), 2):
            question, answer = conversation.turns[index]["content"], conversation.turns[index + 1]["content"]
            self._write_turn(thread, "You", question)
            self._write_heading(thread, title)
            start = _end(thread).position()
            self._write_text(thread, answer)
            self._render_markdown(thread, start, answer)
            thread.answers.append(answer)
            self._write_footer(thread, len(thread.answers), "(from your last session)")
        self._after_change(thread)

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
        """Forgets the conversation shown (and the one saved with ``key``), emptying its transcript; the model stays."""
        thread = self.shown
        self._clear_thread(thread)
        thread.conversation = Conversation(thread.conversation.system)
        if key is not None:
            self._on_disk(thread, lambda: forget_history(*key), "the saved chat could not be deleted")
        self._after_change(thread)

    def clear_view(self) -> None:
        """Empties the transcript and the answers shown (the conversation itself is kept)."""
        self._clear_thread(self.shown)
        self._after_change(self.shown)

    def _clear_thread(self, thread: Thread) -> None:
        thread.answers.clear()
        thread.speeds.clear()
        thread.document.clear()

    def _after_change(self, thread: Thread) -> None:
        """Updates what depends on the conversation shown when ``thread`` is that one."""
        if thread is self.shown:
            self._show_end()
            self.copy_button.setEnabled(bool(thread.answers))
            self._show_hint()
            self.sig_changed.emit()

    def text(self) -> str:
        """The transcript shown, as plain text."""
        return self.transcript.toPlainText()

    # -- the transcript -----------------------------------------------------------------------------------------

    def _follow(self, thread: Thread, cursor: QTextCursor) -> None:
        """Keeps the end of ``thread``'s transcript in view while it is the one shown."""
        if thread.document is self.transcript.document():
            self.transcript.setTextCursor(cursor)
            self.transcript.ensureCursorVisible()

    def _write_heading(self, thread: Thread, who: str) -> None:
        cursor = _end(thread)
        if not thread.document.isEmpty():
            spaced = QTextBlockFormat()
            spaced.setTopMargin(10 if who == "You" else 4)  # a turn starts a little apart from the last one
            cursor.insertBlock(spaced)
        color = current_palette().accent if who == "You" else current_palette().text_muted
        cursor.insertHtml(f'<b style="color:{color}">{html.escape(who)}</b>')
        cursor.insertBlock(QTextBlockFormat())
        self._follow(thread, cursor)

    def _write_turn(self, thread: Thread, who: str, text: str) -> None:
        self._write_heading(thread, who)
        self._write_text(thread, text)

    def _write_text(self, thread: Thread, text: str) -> None:
        cursor = _end(thread)
        cursor.setCharFormat(QTextCharFormat())
        cursor.insertText(text)
        self._follow(thread, cursor)

    def _render_markdown(self, thread: Thread, start: int, text: str) -> None:
        """Replaces the plain text from ``start`` to the end with ``text`` rendered as Markdown."""
        cursor = _end(thread)
        cursor.setPosition(start, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setCharFormat(QTextCharFormat())
        cursor.insertMarkdown(text)
        self._follow(thread, cursor)

    def _write_footer(self, thread: Thread, index: int, words: str) -> None:
        cursor = _end(thread)
        cursor.insertBlock(QTextBlockFormat())
        color = current_palette().text_muted
        cursor.insertHtml(
            f'<span style="color:{color}; font-size:small">{html.escape(words)} · </span>'
            f'<a href="{_COPY}{index}" style="font-size:small">Copy</a>'
        )
        cursor.setCharFormat(QTextCharFormat())
        self._follow(thread, cursor)

    def _write_note(self, thread: Thread, text: str) -> None:
        cursor = _end(thread)
        color = current_palette().text_muted
        cursor.insertHtml(f' <i style="color:{color}">{html.escape(text)}</i>')
        self._follow(thread, cursor)


def recolour(document: QTextDocument, before: Palette, after: Palette) -> None:
    """Draws the text of ``document`` written in ``before``'s accent or muted colour in ``after``'s instead.

    Args:
        document: A transcript.
        before: The palette it was written in.
        after: The palette to draw it in now.
    """
    swaps = {QColor(before.accent).name(): after.accent, QColor(before.text_muted).name(): after.text_muted}
    found: list[tuple[int, int, str]] = []
    block = document.begin()
    while block.isValid():
        pieces = block.begin()
        while not pieces.atEnd():
            piece = pieces.fragment()
            style = piece.charFormat()
            colour = style.foreground().color().name()
            if style.hasProperty(QTextFormat.Property.ForegroundBrush) and colour in swaps:
                found.append((piece.position(), piece.position() + piece.length(), swaps[colour]))
            pieces += 1
        block = block.next()
    cursor = QTextCursor(document)
    for start, end, colour in found:  # changed after the walk: a change splits and merges the fragments walked
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        change = QTextCharFormat()
        change.setForeground(QColor(colour))
        cursor.mergeCharFormat(change)


def _end(thread: Thread) -> QTextCursor:
    """A cursor at the end of ``thread``'s transcript."""
    cursor = QTextCursor(thread.document)
    cursor.movePosition(QTextCursor.MoveOperation.End)
    return cursor


def _retrieve(future: asyncio.Future[ChatModel]) -> None:
    """Marks a load's failure as seen: the caller that awaited it reported it, or no one is waiting any more."""
    if not future.cancelled():
        future.exception()


def _size(path: Path) -> int | None:
    try:
        return folder_bytes(path)
    except OSError:
        return None
