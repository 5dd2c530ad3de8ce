"""The Chat page's choices without a model loaded: how exports are named, the layout of a small window, numbers.

A run's final adapter and its checkpoints export files of the same names; the model list tells them apart. At
1024x700 with both columns, a banner and notes, each transcript keeps several lines and the message field stays in
view (what does not fit above it scrolls). A number typed out of a field's range is said under that field.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QApplication, QComboBox, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings, Theme
from desktop.services.local.chat import Conversation, Message
from desktop.services.local.inventory import exports_folder
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.chat_page import ChatPage
from desktop.ui.theme import apply_theme
from desktop.ui.widgets.chat_column import ChatColumn
from tests.fixtures.exported_models import record_returned_run, write_gguf
from tests.fixtures.qt_input import type_and_leave
from trainer_payload.checkpoints import seal_checkpoint


@pytest.fixture
def page(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> Iterator[ChatPage]:
    widget = ChatPage(AppContext(Settings(), SecretStore(), read_only=True))  # lists and shows; loads nothing
    qtbot.addWidget(widget)
    widget.resize(1100, 760)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget


def labels(combo: QComboBox) -> dict[str, str]:
    """Each listed path to its words."""
    return {combo.itemData(row): combo.itemText(row) for row in range(1, combo.count())}


def test_a_checkpoints_export_and_the_final_adapters_export_are_told_apart(
    page: ChatPage, qloop: asyncio.AbstractEventLoop
) -> None:
    store = RunStore()
    run = record_returned_run(store)
    checkpoint = store.folder(run) / "checkpoints" / "checkpoint-20"
    shutil.copytree(Path(store.get(run).adapter or ""), checkpoint)
    seal_checkpoint(checkpoint, 20)
    final = write_gguf(exports_folder(run) / "model-Q4_K_M.gguf", size=105_000_000)
    step = write_gguf(exports_folder(f"{run}-step-20") / "model-Q4_K_M.gguf", size=105_000_000)
    base = write_gguf(exports_folder(f"{run}-step-20") / "base-Q8_0.gguf", file_type=7, size=180_000_000)

    qloop.run_until_complete(page.load())

    listed = labels(page.pickers[0].combo)
    assert listed[str(final)] == f"model-Q4_K_M.gguf — final adapter of run {run}, 105 MB"
    assert listed[str(step)] == f"model-Q4_K_M.gguf — step-20 checkpoint of run {run}, 105 MB"
    assert listed[str(base)] == f"base-Q8_0.gguf — base model, exported with run {run} (step 20), 180 MB"
    combo = page.pickers[0].combo
    row = combo.findData(str(step))
    assert combo.itemData(row, Qt.ItemDataRole.ToolTipRole) == listed[str(step)]  # whole, where the box cuts it
    combo.setCurrentIndex(row)
    combo.activated.emit(row)
    assert page.columns[0].model_label.text() == f"model-Q4_K_M.gguf (105 MB) · step-20 checkpoint of run {run}"


@pytest.fixture
def small_window(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> MainWindow:
    window = MainWindow(Settings(), SecretStore(), AppContext(Settings(), SecretStore(), read_only=True))
    qtbot.addWidget(window)
    window.resize(1024, 700)
    window.show()
    qtbot.waitExposed(window)
    qloop.run_until_complete(window.load_pages(follow_runs=False))
    window.show_page("chat")
    return window


def test_at_1024_by_700_each_transcript_keeps_several_lines(small_window: MainWindow) -> None:
    page = small_window.page("chat")
    assert isinstance(page, ChatPage)
    page.side_check.setChecked(True)
    page.banner.show_message(
        "success", "Added this chat to good-chats.jsonl.", "/home/someone/good-chats.jsonl\nUse it as training data."
    )
    page.temperature_note.show_words("Temperature: 99 is above the highest it takes, 2.00; it is that now.")
    page.tokens_note.show_words("Longest answer: 0 is below the lowest it takes, 1; it is that now.")
    QApplication.processEvents()

    for column in page.columns:
        viewport = column.transcript.viewport().height()
        assert viewport >= 6 * column.transcript.fontMetrics().lineSpacing(), f"{column.name}: {viewport} px"
    squashed = [
        widget.accessibleName()
        for widget in (*page.pickers, *page.lora_pickers, page.system_edit, page.prompt, page.send_button)
        if widget.isVisible() and widget.height() < (widget.minimumHeight() or widget.minimumSizeHint().height())
    ]
    assert not squashed, squashed
    bottom = page.prompt.mapTo(page, page.prompt.rect().bottomLeft()).y()
    assert bottom <= page.height(), "the message field stays in view; what does not fit above it scrolls"


def test_at_1024_by_700_one_model_and_the_message_field_fit_without_scrolling(small_window: MainWindow) -> None:
    page = small_window.page("chat")
    assert isinstance(page, ChatPage)
    QApplication.processEvents()
    transcript = page.columns[0].transcript
    assert transcript.viewport().height() >= 8 * transcript.fontMetrics().lineSpacing()
    bottom = page.prompt.mapTo(page, page.prompt.rect().bottomLeft()).y()
    assert bottom <= page.height(), "the message field is in view"


def under(note: QWidget, field: QWidget) -> bool:
    """Whether ``note`` lies right under ``field``: just below it, its words ending where the field ends."""
    parent = note.parentWidget()
    field_box = QRect(field.mapTo(parent, QPoint(0, 0)), field.size())
    spot = note.geometry()
    right_aligned = bool(note.alignment() & Qt.AlignmentFlag.AlignRight)
    return right_aligned and 0 <= spot.top() - field_box.bottom() <= 60 and abs(spot.right() - field_box.right()) <= 4


def test_a_temperature_above_the_highest_is_said_beside_its_field(page: ChatPage, qtbot: QtBot) -> None:
    type_and_leave(qtbot, page.temperature_spin, "99")
    assert page.temperature_spin.value() == 2.0
    assert page.temperature_note.isVisible() and page.temperature_note.text() == (
        "Temperature: “99” is above the highest it takes, so it is 2.00 now. Type a number from 0.00 to 2.00."
    )
    type_and_leave(qtbot, page.tokens_spin, "0")
    assert page.tokens_note.isVisible() and page.tokens_note.text().startswith("Longest answer: “0” is below")
    assert page.temperature_note.isVisible(), "each field keeps saying its own correction"
    assert under(page.temperature_note, page.temperature_spin) and under(page.tokens_note, page.tokens_spin)
    type_and_leave(qtbot, page.temperature_spin, "1.5")
    assert page.temperature_spin.value() == 1.5 and not page.temperature_note.isVisible()
    assert page.tokens_note.isVisible()


def colours_of(document: QTextDocument) -> dict[str, set[str]]:
    """The colours each run of text of ``document`` is drawn in, by its text (one line each here)."""
    found: dict[str, set[str]] = {}
    block = document.begin()
    while block.isValid():
        iterator = block.begin()
        while not iterator.atEnd():
            piece = iterator.fragment()
            found.setdefault(piece.text().strip(), set()).add(piece.charFormat().foreground().color().name())
            iterator += 1
        block = block.next()
    return found


def test_a_transcript_shown_takes_the_new_themes_colours_when_the_theme_changes(qtbot: QtBot) -> None:
    apply_theme(Theme.LIGHT)
    column = ChatColumn("Fine-tuned")
    qtbot.addWidget(column)
    turns: list[Message] = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    column.show_saved(Conversation(turns=turns))
    try:
        dark = apply_theme(Theme.DARK)
        colours = colours_of(column.transcript.document())
        assert colours["You"] == {dark.accent}, "the asker's name is drawn in the dark theme's accent"
        assert colours["Fine-tuned"] == {dark.text_muted}
        assert colours["(from your last session) ·"] == {dark.text_muted}
        assert colours["Copy"] == {dark.accent}
        light = apply_theme(Theme.LIGHT)
        assert colours_of(column.transcript.document())["You"] == {light.accent}, "and back"
    finally:
        apply_theme(Theme.LIGHT)
