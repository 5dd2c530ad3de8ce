"""A card showing the long local step in progress: what it is, its current step, a progress bar and Cancel."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar

from desktop.ui.widgets.blocks import Card, caption, destructive_button

#: The progress bar's range: fractions are shown in tenths of a percent.
_STEPS = 1000


class TaskCard(Card):
    """Hidden until a step starts; Cancel emits ``sig_cancel`` (the page stops the work).

    Progress comes as (text, fraction) with fraction in 0..1 or None when unknown (the bar then shows activity).
    """

    sig_cancel = Signal()

    def __init__(self) -> None:
        super().__init__("Working")
        self.setAccessibleName("Step in progress")
        self.step_label = QLabel()
        self.step_label.setWordWrap(True)
        self.step_label.setAccessibleName("Current step")
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Progress of the step")
        self.bar.setTextVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.bar, 1)
        self.cancel_button = destructive_button("Ca&ncel", "x", "Cancel the step in progress")
        self.cancel_button.clicked.connect(lambda _checked=False: self.sig_cancel.emit())
        row.addWidget(self.cancel_button)
        self.body.addWidget(self.step_label)
        self.body.addLayout(row)
        self.note_label = caption()
        self.note_label.hide()
        self.body.addWidget(self.note_label)
        self.hide()

    def start(self, title: str, note: str = "") -> None:
        """Shows the card for a new step called ``title``."""
        assert self.title_label is not None
        self.title_label.setText(title)
        self.setAccessibleName(title)
        self.step_label.setText("Starting…")
        self.note_label.setText(note)
        self.note_label.setVisible(bool(note))
        self.bar.setRange(0, 0)
        self.cancel_button.setEnabled(True)
        self.show()

    def show_progress(self, value: tuple[str, float | None]) -> None:
        """Shows a progress report: the step's words and how far it is."""
        text, fraction = value
        self.step_label.setText(text[:1].upper() + text[1:] if text else "Working…")
        if fraction is None:
            self.bar.setRange(0, 0)
        else:
            self.bar.setRange(0, _STEPS)
            self.bar.setValue(round(max(0.0, min(1.0, fraction)) * _STEPS))

    def stopping(self) -> None:
        """Says the step is being stopped (its child process killed, its partial output removed)."""
        self.step_label.setText("Stopping: removing what was half-written…")
        self.cancel_button.setEnabled(False)

    def finish(self) -> None:
        """Hides the card."""
        self.hide()
