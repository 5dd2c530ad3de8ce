"""Small modal questions the pages ask before doing something that cannot be undone."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop.core.runs.spec import RunSpecError, SshTarget, targets_from_lines
from desktop.ui.widgets.blocks import destructive_button, heading, plain_button, primary_button, set_role


class ConfirmDialog(QDialog):
    """A question in the app's own look: its title as a heading, the question, and two named buttons.

    The safe answer (``cancel``) is the default, so Enter never does what cannot be undone.
    """

    def __init__(
        self,
        parent: QWidget | None,
        title: str,
        question: str,
        action: str,
        cancel: str,
        *,
        destructive: bool = False,
        option: str | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.setAccessibleName(title)
        self.setMinimumWidth(460)
        layout = QVBoxLayout(self)
        layout.setSpacing(12)
        layout.addWidget(heading(title))
        text = QLabel(question)
        text.setWordWrap(True)
        text.setAccessibleName("Question")
        layout.addWidget(text)
        self.option_box = QCheckBox(option or "")
        self.option_box.setAccessibleName(option or "")
        self.option_box.setVisible(option is not None)
        layout.addWidget(self.option_box)
        row = QHBoxLayout()
        row.addStretch(1)
        self.cancel_button = plain_button(cancel, accessible_name=cancel.replace("&", ""))
        make = destructive_button if destructive else primary_button
        self.action_button = make(action, None, action.replace("&", ""))
        self.cancel_button.clicked.connect(self.reject)
        self.action_button.clicked.connect(self.accept)
        self.cancel_button.setDefault(True)
        row.addWidget(self.cancel_button)
        row.addWidget(self.action_button)
        layout.addLayout(row)


def confirm(
    parent: QWidget | None,
    title: str,
    question: str,
    action: str = "&Yes",
    cancel: str = "&No",
    *,
    destructive: bool = False,
) -> bool:
    """Asks a question in a modal :class:`ConfirmDialog`, the safe answer being the default; True for ``action``.

    Call it from a plain (not ``async``) slot: a modal dialog runs its own event loop.
    """
    dialog = ConfirmDialog(parent, title, question, action, cancel, destructive=destructive)
    return dialog.exec() == QDialog.DialogCode.Accepted


def confirm_with_option(
    parent: QWidget | None, title: str, question: str, action: str, cancel: str, *, option: str
) -> tuple[bool, bool]:
    """:func:`confirm` (destructive) with a check box below the question, off at first; (accepted, box ticked)."""
    dialog = ConfirmDialog(parent, title, question, action, cancel, destructive=True, option=option)
    accepted = dialog.exec() == QDialog.DialogCode.Accepted
    return accepted, accepted and dialog.option_box.isChecked()


class TextDialog(QDialog):
    """A message shown whole, selectable, with a Close button (a status line that did not fit, say)."""

    def __init__(self, parent: QWidget, title: str, text: str) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.setAccessibleName(title)
        self.setMinimumWidth(520)
        layout = QVBoxLayout(self)
        layout.addWidget(heading(title))
        self.text_label = QLabel(text)
        self.text_label.setWordWrap(True)
        self.text_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.text_label)
        row = QHBoxLayout()
        row.addStretch(1)
        close = primary_button("&Close", None, "Close")
        close.clicked.connect(self.accept)
        row.addWidget(close)
        layout.addLayout(row)


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


class NewTargetsDialog(QDialog):
    """Asks for a fresh set of SSH servers to continue a run on several machines (one of them was lost).

    One server per line, the head first; OK keeps the dialog open with what is wrong until there is one per machine.
    """

    def __init__(self, parent: QWidget | None, current: list[SshTarget]) -> None:
        super().__init__(parent)
        self.machines, self.base = len(current), current[0]
        self.setWindowTitle("Continue on other servers")
        self.setAccessibleName("Continue the run on other servers")
        form = QFormLayout(self)
        note = QLabel(
            f"The run trains on {self.machines} machines. It continues on these servers from the newest checkpoint on "
            "this computer: one server per line (user@host:port), the head (rank 0) first, the others reaching it at "
            "its host name."
        )
        note.setWordWrap(True)
        form.addRow(note)
        self.hosts_edit = QPlainTextEdit("\n".join(f"{t.user}@{t.host}:{t.port}" for t in current))
        self.hosts_edit.setTabChangesFocus(True)
        self.hosts_edit.setAccessibleName("Servers, one per line, the head first")
        rows = min(max(self.machines, 3), 8) + 1  # every server in view, without a tall empty box
        self.hosts_edit.setFixedHeight(rows * self.fontMetrics().lineSpacing() + 12)
        self.setMinimumWidth(34 * self.fontMetrics().averageCharWidth() * 2)
        self.key_edit = QLineEdit(str(self.base.identity) if self.base.identity else "")
        self.python_edit = QLineEdit(self.base.python)
        for label, field in (
            ("&Servers", self.hosts_edit),
            ("&Key file", self.key_edit),
            ("P&ython", self.python_edit),
        ):
            field.setAccessibleName(field.accessibleName() or label.replace("&", ""))
            form.addRow(label, field)
        self.problem_label = QLabel()
        self.problem_label.setWordWrap(True)
        set_role(self.problem_label, "note", "danger")
        form.addRow(self.problem_label)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.on_ok)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self.chosen: tuple[SshTarget, ...] = ()

    def on_ok(self) -> None:
        """Accepts the servers when there is one per machine, each an address; else says what is wrong."""
        key = self.key_edit.text().strip()
        base = SshTarget(
            self.base.user,
            self.base.host,
            self.base.port,
            Path(key).expanduser() if key else None,
            self.python_edit.text().strip() or "python3",
            self.base.workdir,
            self.base.authorized_keys,
        )
        try:
            self.chosen = targets_from_lines(self.hosts_edit.toPlainText(), base, self.machines)
        except RunSpecError as exc:
            self.problem_label.setText(f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
            return
        self.accept()


def ask_new_targets(parent: QWidget, current: list[SshTarget]) -> tuple[SshTarget, ...]:
    """Shows :class:`NewTargetsDialog`; the servers entered, or none when cancelled."""
    dialog = NewTargetsDialog(parent, current)
    return dialog.chosen if dialog.exec() == QDialog.DialogCode.Accepted else ()
