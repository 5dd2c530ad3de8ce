"""What every page of the new-run wizard has in common."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from desktop.core.runs.draft import RunDraft
from desktop.ui.context import AppContext


class WizardStep(QWidget):
    """One page of the wizard.

    The wizard calls :meth:`show_draft` when the step is entered, :meth:`validate` before Next (a message blocks
    the move and is shown to the user), and :meth:`save_into` to copy the step's choices into the draft, which it
    then saves to disk. ``sig_changed`` tells the wizard to re-check whether Next is allowed.
    """

    #: Name used by ``rentune --screenshot --page NAME``.
    step_name = ""
    #: Short label in the wizard's step list.
    title = ""
    #: One sentence saying what the step is for.
    purpose = ""

    sig_changed = Signal()

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.context = context
        self.setObjectName(f"{self.step_name}_step")
        self.setAccessibleName(f"{self.title} step")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(10)
        if self.purpose:
            purpose = QLabel(self.purpose)
            purpose.setWordWrap(True)
            outer.addWidget(purpose)
        self.body = QVBoxLayout()
        self.body.setSpacing(10)
        outer.addLayout(self.body, 1)

    @property
    def draft(self) -> RunDraft:
        """The wizard's shared draft."""
        return self.context.draft

    def show_draft(self) -> None:
        """Fills the widgets from the draft (called every time the step is entered)."""

    def validate(self) -> str | None:
        """Returns why the wizard may not move on yet (what to fix), or None when the step is complete."""
        return None

    def save_into(self, draft: RunDraft) -> None:
        """Copies the widgets' values into ``draft``."""

    async def load(self) -> None:
        """Fetches what the step shows without blocking the UI; called once when the window opens."""
