"""The question before deleting something that cost money or time: it names exactly what is lost and what stays.

Never a bare Yes/No: the headline says what goes, the lines under it what it was (a run's adapter, its training
time and cost, whether it can be brought back), and "Keep it" is the default answer, so Enter or Escape keeps it.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from desktop.ui.design.icons import tint
from desktop.ui.widgets.blocks import caption, destructive_button, heading, plain_button


class ConfirmDeleteDialog(QDialog):
    """Asks before a delete, naming what is lost; ``accepted`` means delete.

    Open it with :meth:`open` (it does not block the event loop) and connect ``accepted`` to the delete.

    Args:
        parent: The page asking.
        headline: What is deleted, as a question ("Delete the adapter of run X?").
        losses: What is lost, one sentence each.
        keeps: What stays (shown in muted text), or "".
        action: The delete button's text ("Delete adapter").
    """

    def __init__(self, parent: QWidget, headline: str, losses: list[str], keeps: str, action: str) -> None:
        super().__init__(parent)
        self.setWindowTitle("Delete for good?")
        self.setAccessibleName(headline)
        self.setMinimumWidth(460)
        self.setMaximumWidth(620)
        layout = QVBoxLayout(self)
        layout.setSpacing(10)
        layout.addLayout(self._title_row(headline))
        self.loss_labels = [self._loss(text) for text in losses]
        for label in self.loss_labels:
            layout.addWidget(label)
        self.keeps_label = caption(keeps)
        self.keeps_label.setVisible(bool(keeps))
        layout.addWidget(self.keeps_label)
        layout.addLayout(self._buttons(action))

    def _title_row(self, headline: str) -> QHBoxLayout:
        row = QHBoxLayout()
        picture = QLabel()
        tint(picture, "trash-2", "danger", 24)
        picture.setAlignment(Qt.AlignmentFlag.AlignTop)
        self.headline_label = heading(headline)
        self.headline_label.setWordWrap(True)
        row.addWidget(picture)
        row.addWidget(self.headline_label, 1)
        return row

    def _loss(self, text: str) -> QLabel:
        label = QLabel(text)
        label.setWordWrap(True)
        label.setTextFormat(Qt.TextFormat.PlainText)
        label.setAccessibleName(text)
        return label

    def _buttons(self, action: str) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addStretch(1)
        self.keep_button = plain_button("&Keep it", accessible_name="Keep it: delete nothing")
        self.delete_button = destructive_button(action, "trash-2")
        self.keep_button.setDefault(True)
        self.keep_button.setAutoDefault(True)
        self.delete_button.setAutoDefault(False)
        self.keep_button.clicked.connect(self.reject)
        self.delete_button.clicked.connect(self.accept)
        row.addWidget(self.delete_button)
        row.addWidget(self.keep_button)
        self.keep_button.setFocus()
        return row

    def text(self) -> str:
        """Everything the dialog says, for tests and screen readers."""
        parts = [self.headline_label.text(), *(label.text() for label in self.loss_labels), self.keeps_label.text()]
        return "\n".join(part for part in parts if part)
