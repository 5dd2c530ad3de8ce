"""Every number field outside the model step also says why it changed a number typed out of its range.

Qt alone refuses a keystroke that would pass a field's highest number (999999 became 99 without a word): a watched
field shows what was typed and, when it is taken, says what it became beside the field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDoubleSpinBox, QScrollArea, QSpinBox, QVBoxLayout, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.chat_page import ChatPage
from desktop.ui.pages.settings_page import SettingsPage
from desktop.ui.widgets.number_fields import CorrectionNote
from desktop.ui.widgets.own_server_form import OwnServerForm
from tests.fixtures.qt_input import type_and_leave


def own_server(_qloop: asyncio.AbstractEventLoop) -> tuple[QWidget, list[tuple[str, str, str, CorrectionNote]]]:
    form = OwnServerForm()
    note = form.correction_note
    below = "Port: “0” is below the lowest it takes, so it is 1 now. Type a number from 1 to 65535."
    above = "Port: “70000” is above the highest it takes, so it is 65535 now. Type a number from 1 to 65535."
    return form, [("port_spin", "0", below, note), ("port_spin", "70000", above, note)]


def chat(qloop: asyncio.AbstractEventLoop) -> tuple[QWidget, list[tuple[str, str, str, CorrectionNote]]]:
    page = ChatPage(AppContext(Settings(), SecretStore()))
    note = page.tokens_note
    said = "Longest answer: “0” is below the lowest it takes, so it is 1 tokens now. Type a number from 1 to 8192."
    return page, [("tokens_spin", "0", said, note)]


def settings(_qloop: asyncio.AbstractEventLoop) -> tuple[QWidget, list[tuple[str, str, str, CorrectionNote]]]:
    page = SettingsPage(Settings(), SecretStore())
    name, fix = "Checkpoints kept per run", "Type a number from 1 to 100."
    below = f"{name}: “0” is below the lowest it takes, so it is 1 now. {fix}"
    above = f"{name}: “999999” is above the highest it takes, so it is 100 now. {fix}"  # was 99, silently
    return page, [("keep_spin", "0", below, page.keep_note), ("keep_spin", "999999", above, page.keep_note)]


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


def price_and_count(qtbot: QtBot) -> tuple[QWidget, QDoubleSpinBox, CorrectionNote, QSpinBox, CorrectionNote]:
    """A price with a prefix, a suffix and a word for 0 (as Compute's Max price) and a whole number, each noted."""
    form = QWidget()
    layout = QVBoxLayout(form)
    price = QDoubleSpinBox()
    price.setRange(0.0, 500.0)
    price.setPrefix("$ ")
    price.setSuffix(" per hour")
    price.setSpecialValueText("Any price")
    count = QSpinBox()
    count.setRange(1, 1000)
    count.setGroupSeparatorShown(True)
    price_note, count_note = CorrectionNote(), CorrectionNote()
    price_note.watch(price, "Max price")
    count_note.watch(count, "Checkpoints kept")
    for widget in (price, price_note, count, count_note):
        layout.addWidget(widget)
    qtbot.addWidget(form)
    form.show()
    qtbot.waitExposed(form)
    return form, price, price_note, count, count_note


def test_a_number_above_the_highest_or_below_the_lowest_is_said_with_exactly_what_was_typed(qtbot: QtBot) -> None:
    # Qt refuses the keystroke that passes the highest number ("999999" stayed "999", "-5" stayed "-"): every
    # keystroke is taken, and leaving the field says what became of it.
    _form, price, price_note, count, count_note = price_and_count(qtbot)
    type_and_leave(qtbot, count, "999999")
    assert count.value() == 1000
    assert count_note.isVisible() and count_note.text() == (
        "Checkpoints kept: “999999” is above the highest it takes, so it is 1,000 now. Type a number from 1 to 1,000."
    )
    type_and_leave(qtbot, price, "2.5")
    assert price.value() == 2.5 and not price_note.isVisible()
    type_and_leave(qtbot, price, "-5")
    assert price.value() == 2.5 and price.text() == "$ 2.50 per hour", "a mistyped -5 must not lift the cap"
    assert price_note.isVisible() and price_note.text() == (
        "Max price: “-5” is below the lowest it takes, so it stays $ 2.50 per hour. "
        "Type a number from 0.00 to 500.00 (0.00 means Any price)."
    )
    assert count_note.isVisible(), "each field keeps saying its own correction"
    type_and_leave(qtbot, price, "-")
    assert price.value() == 2.5, "what is not a number leaves the number as it was"
    assert price_note.text() == (
        "Max price: “-” is not a number, so it stays $ 2.50 per hour. "
        "Type a number from 0.00 to 500.00 (0.00 means Any price)."
    )


def test_enter_in_a_number_field_says_the_correction_at_once(qtbot: QtBot) -> None:
    _form, _price, _price_note, count, count_note = price_and_count(qtbot)
    count.setFocus()
    qtbot.waitUntil(count.hasFocus)
    count.selectAll()
    qtbot.keyClicks(count, "2000")
    assert count.lineEdit().text() == "2000", "what is typed shows as typed until it is taken"
    qtbot.keyClick(count, Qt.Key.Key_Return)
    assert count.hasFocus() and count.value() == 1000
    assert count_note.isVisible() and "“2000” is above the highest it takes" in count_note.text()


def test_a_correction_is_scrolled_into_view_under_its_field(qtbot: QtBot) -> None:
    # Compute's Budget, reached by its shortcut, sits under the fold: its correction was said out of sight.
    area = QScrollArea()
    area.setWidgetResizable(True)
    content = QWidget()
    layout = QVBoxLayout(content)
    layout.addSpacing(900)
    budget = QDoubleSpinBox()
    budget.setRange(0.0, 100.0)
    note = CorrectionNote()
    note.watch(budget, "Budget")
    layout.addWidget(budget)
    layout.addWidget(note)
    area.setWidget(content)
    area.resize(300, 400)
    qtbot.addWidget(area)
    area.show()
    qtbot.waitExposed(area)
    budget.setFocus()
    qtbot.waitUntil(budget.hasFocus)
    area.ensureWidgetVisible(budget, 0, 0)  # at the bottom edge, as a field reached by its shortcut may be
    budget.selectAll()
    qtbot.keyClicks(budget, "500")
    qtbot.keyClick(budget, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: note.visibleRegion().boundingRect().height() == note.height())
    assert budget.value() == 100 and note.text().startswith("Budget: “500” is above the highest it takes")
