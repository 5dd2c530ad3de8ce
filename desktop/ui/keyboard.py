"""Keyboard navigation that works everywhere: Tab always moves to the next control."""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractItemView, QPlainTextEdit, QTextEdit, QWidget


def make_tab_friendly(root: QWidget) -> None:
    """Stops tables, lists and text views from swallowing Tab, so a keyboard user can always move on.

    Item views move between cells with Tab by default and text views insert a tab character; in a form-like app
    that traps the focus. Arrow keys still move inside them.
    """
    for view in root.findChildren(QAbstractItemView):
        view.setTabKeyNavigation(False)
    for text in root.findChildren(QPlainTextEdit):
        text.setTabChangesFocus(True)
    for rich in root.findChildren(QTextEdit):
        rich.setTabChangesFocus(True)
