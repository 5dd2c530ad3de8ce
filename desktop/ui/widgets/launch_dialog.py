"""The one question before a run starts: what will be rented (or used), at what rate, for about how much."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget

from desktop.ui.widgets.blocks import set_role

#: The object name of the dialog's launch button (tests press it).
LAUNCH_BUTTON = "confirm_launch_button"


def confirm_launch(parent: QWidget, title: str, summary: str, details: str, action: str, *, anyway: bool) -> bool:
    """Asks before launching; True when the user pressed ``action``. Cancel is the default (Enter, Escape).

    Call it from a plain (not ``async``) slot: a modal box runs its own event loop.

    Args:
        parent: The page asking.
        title: The window title.
        summary: The question in one sentence, naming the machine, the rate and the estimated total.
        details: The budget, what happens to the machine, and the red items launched despite.
        action: The launch button's words ("Rent and launch").
        anyway: Launching despite red items: the button is styled as a destructive action.
    """
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning if anyway else QMessageBox.Icon.Question)
    box.setWindowTitle(title)
    box.setText(summary)
    box.setInformativeText(details)
    box.setAccessibleName(title)
    launch = box.addButton(action, QMessageBox.ButtonRole.AcceptRole)
    launch.setObjectName(LAUNCH_BUTTON)
    launch.setAccessibleName(action)
    set_role(launch, "destructive" if anyway else "primary")
    cancel = box.addButton(QMessageBox.StandardButton.Cancel)
    cancel.setAccessibleName("Cancel: launch nothing")
    box.setDefaultButton(cancel)
    box.setEscapeButton(cancel)
    box.exec()
    return box.clickedButton() is launch
