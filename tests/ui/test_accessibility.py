"""Every control on every page has an accessible name, so screen readers and keyboard users know what it is."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QWidget,
)
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.platform.secrets import SecretStore
from desktop.ui.main_window import MainWindow

CONTROLS = (
    QAbstractButton,
    QLineEdit,
    QAbstractSpinBox,
    QComboBox,
    QAbstractItemView,
    QPlainTextEdit,
    QTextEdit,
    QAbstractSlider,
)


def _unnamed_controls(page: QWidget) -> list[str]:
    """The focusable controls of ``page`` without an accessible name (a combo box's own popup list excepted)."""
    unnamed = []
    for child in page.findChildren(QWidget):
        if not isinstance(child, CONTROLS) or child.focusPolicy() == Qt.FocusPolicy.NoFocus:
            continue
        if isinstance(child.parent(), (QAbstractSpinBox, QComboBox)) or _in_combo_popup(child):
            continue
        if not child.accessibleName():
            text = child.text() if isinstance(child, (QAbstractButton, QLineEdit)) else ""
            unnamed.append(f"{type(child).__name__} {child.objectName()!r} {text!r}")
    return unnamed


def _in_combo_popup(widget: QWidget) -> bool:
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QComboBox):
            return True
        parent = parent.parentWidget()
    return False


def test_every_control_on_every_page_has_an_accessible_name(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> None:
    window = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    problems = {}
    for name in window.page_names():
        window.show_page(name)
        unnamed = _unnamed_controls(window.stack.currentWidget())
        if unnamed:
            problems[name] = unnamed
    assert problems == {}
