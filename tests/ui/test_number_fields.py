"""Every number field outside the model step also says why it changed a number typed out of its range.

Qt refuses a keystroke that would pass a field's highest number, so what is typed out of range and then changed is
a number below the lowest (0 where 1 is the least).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractSpinBox, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.chat_page import ChatPage
from desktop.ui.pages.settings_page import SettingsPage
from desktop.ui.widgets.number_fields import CorrectionNote
from desktop.ui.widgets.own_server_form import OwnServerForm


def type_and_leave(qtbot: QtBot, box: QAbstractSpinBox, text: str) -> None:
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    box.selectAll()
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key.Key_Tab)


def own_server(_qloop: asyncio.AbstractEventLoop) -> tuple[QWidget, list[tuple[str, str, str, CorrectionNote]]]:
    form = OwnServerForm()
    note = form.correction_note
    said = "Port: 0 is below the lowest it takes, 1; it is that now."
    return form, [("port_spin", "0", said, note)]


def chat(qloop: asyncio.AbstractEventLoop) -> tuple[QWidget, list[tuple[str, str, str, CorrectionNote]]]:
    page = ChatPage(AppContext(Settings(), SecretStore()))
    note = page.settings_note
    said = "Longest answer: 0 is below the lowest it takes, 1; it is that now."
    return page, [("tokens_spin", "0", said, note)]


def settings(_qloop: asyncio.AbstractEventLoop) -> tuple[QWidget, list[tuple[str, str, str, CorrectionNote]]]:
    page = SettingsPage(Settings(), SecretStore())
    said = "Checkpoints kept per run: 0 is below the lowest it takes, 1; it is that now."
    return page, [("keep_spin", "0", said, page.keep_note)]


@pytest.mark.parametrize("build", [own_server, chat, settings])
def test_a_number_out_of_range_is_said_beside_its_field(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    build: Callable[[asyncio.AbstractEventLoop], tuple[QWidget, list[tuple[str, str, str, CorrectionNote]]]],
) -> None:
    widget, cases = build(qloop)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    for attribute, typed, said, note in cases:
        box = getattr(widget, attribute)
        type_and_leave(qtbot, box, typed)
        assert note.isVisible() and note.text() == said
        type_and_leave(qtbot, box, "2")
        assert not note.isVisible(), "a number in range clears the note"
