"""The chat's message field: Enter sends, Shift+Enter starts a new line, Tab moves on."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class PromptEdit(QPlainTextEdit):
    """A few lines of text; ``sig_send`` on Enter (or the keypad's Enter) without Shift."""

    sig_send = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)
        self.setPlaceholderText("Type a message. Enter sends it, Shift+Enter starts a new line.")
        self.setAccessibleName("Message")
        self.setAccessibleDescription("Enter sends the message; Shift+Enter starts a new line")
        lines = self.fontMetrics().lineSpacing()
        self.setFixedHeight(lines * 3 + 18)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Enter sends; Shift+Enter (or Ctrl+Enter) inserts a line break."""
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        modifiers = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
        if enter and modifiers == Qt.KeyboardModifier.NoModifier:
            self.sig_send.emit()
            return
        if enter:
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)

    def text(self) -> str:
        """The message as typed."""
        return self.toPlainText()
