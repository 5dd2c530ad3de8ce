"""Small modal questions the pages ask before doing something that cannot be undone."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget


def confirm(parent: QWidget, title: str, question: str) -> bool:
    """Asks a yes/no question in a modal box, No being the default; True when the user answers Yes.

    Call it from a plain (not ``async``) slot: a modal box runs its own event loop.
    """
    answer = QMessageBox.question(
        parent,
        title,
        question,
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        QMessageBox.StandardButton.No,
    )
    return answer == QMessageBox.StandardButton.Yes
