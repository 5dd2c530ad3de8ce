"""A warning strip for machines that bill with no live run to use them (orphans), with a way to terminate them."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget
from qasync import asyncSlot

from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.orphans import MachinesReport, burn_rate, stop_orphans
from desktop.services.runs.store import RunStore
from desktop.ui.widgets.dialogs import confirm


def orphans_text(report: MachinesReport) -> str:
    """The banner's words: how many orphans, what they burn, and which they are."""
    orphans = report.orphans
    names = ", ".join(f"{m.instance.provider.label} {m.instance.name}" for m in orphans)
    if len(orphans) == 1:
        count = "1 rented machine that no run uses still bills"
    else:
        count = f"{len(orphans)} rented machines that no run uses still bill"
    return f"⚠ {count} ${burn_rate(report):.2f}/h: {names}."


class OrphansBanner(QFrame):
    """Hidden until orphans are found; says what they burn, and terminates them on request (after asking)."""

    sig_stopped = Signal(str)

    def __init__(self, store: RunStore, secrets: SecretStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store, self.secrets = store, secrets
        self.report: MachinesReport | None = None
        self.setObjectName("orphans_banner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        # Amber reads as "money is leaking" in light and dark alike; the text keeps the palette's colour.
        self.setStyleSheet("#orphans_banner { border: 1px solid #d29a00; border-left: 5px solid #d29a00; }")
        self.setAccessibleName("Orphaned machines")
        row = QHBoxLayout(self)
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.stop_button = QPushButton("Terminate them…")
        self.stop_button.setAccessibleName("Terminate the orphaned machines")
        self.stop_button.clicked.connect(self.on_stop_clicked)
        row.addWidget(self.text, 1)
        row.addWidget(self.stop_button)
        self.hide()

    def show_report(self, report: MachinesReport) -> None:
        """Shows the banner when the report has orphans (hides it otherwise)."""
        self.report = report
        if not report.orphans:
            self.hide()
            return
        self.text.setText(orphans_text(report))
        self.stop_button.setEnabled(True)
        self.show()

    def on_stop_clicked(self) -> None:
        """Asks, then terminates the orphans in the background."""
        report = self.report
        if report is None or not report.orphans:
            return
        question = (
            f"{orphans_text(report)}\n\nTerminate them now? Their disks are deleted; no Rentune run uses them "
            "(a run's checkpoints are already on this computer)."
        )
        if confirm(self, "Terminate orphaned machines", question):
            self.stop_button.setEnabled(False)
            self._terminate(report)

    @asyncSlot()
    async def _terminate(self, report: MachinesReport) -> None:
        stopped, problems = await stop_orphans(self.store, report, self.secrets)
        words = f"terminated {len(stopped)} orphaned machine{'s' if len(stopped) != 1 else ''}"
        if problems:
            self.text.setText(f"⚠ {words}; not terminated: {'; '.join(problems)}")
            self.stop_button.setEnabled(True)
        else:
            self.hide()
        self.sig_stopped.emit(words)
