"""Small modal questions the pages ask before doing something that cannot be undone."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QSpinBox,
    QWidget,
)

from desktop.core.runs.spec import SshTarget


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


class NewTargetDialog(QDialog):
    """Asks for another SSH server to continue a run on (its machine was lost or is unusable)."""

    def __init__(self, parent: QWidget | None, current: SshTarget | None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Continue on another server")
        self.setAccessibleName("Continue the run on another server")
        form = QFormLayout(self)
        note = QLabel("The run continues there from the newest checkpoint on this computer.")
        note.setWordWrap(True)
        form.addRow(note)
        self.host_edit, self.user_edit = QLineEdit(), QLineEdit(current.user if current else "")
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(current.port if current else 22)
        self.key_edit = QLineEdit(str(current.identity) if current and current.identity else "")
        self.python_edit = QLineEdit(current.python if current else "python3")
        for label, field in (
            ("&Host", self.host_edit),
            ("&Port", self.port_spin),
            ("&User", self.user_edit),
            ("&Key file", self.key_edit),
            ("P&ython", self.python_edit),
        ):
            field.setAccessibleName(label.replace("&", ""))
            form.addRow(label, field)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def target(self) -> SshTarget | None:
        """The server entered, or None while host or user is missing."""
        host, user = self.host_edit.text().strip(), self.user_edit.text().strip()
        if not host or not user:
            return None
        key = self.key_edit.text().strip()
        python = self.python_edit.text().strip() or "python3"
        return SshTarget(user, host, self.port_spin.value(), Path(key).expanduser() if key else None, python)


def ask_new_target(parent: QWidget, current: SshTarget | None) -> SshTarget | None:
    """Shows :class:`NewTargetDialog`; the server entered, or None when cancelled or incomplete."""
    dialog = NewTargetDialog(parent, current)
    return dialog.target() if dialog.exec() == QDialog.DialogCode.Accepted else None
