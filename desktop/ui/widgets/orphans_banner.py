"""A warning strip for machines that bill with no live run to use them (orphans), with a way to terminate them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QWidget
from qasync import asyncSlot

from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui.widgets.blocks import Banner, destructive_button
from desktop.ui.widgets.dialogs import confirm

if TYPE_CHECKING:  # the orphan search loads the providers and SSH: only once the window is up
    from desktop.services.renting.orphans import MachinesReport

DETAILS = "Rentune found them at your providers. Terminate them unless you started them yourself outside Rentune."
UNREAD_DETAILS = "They may bill unseen: check them in the provider's console."


def orphans_text(report: MachinesReport) -> str:
    """The banner's words: how many orphans, what they burn, and which they are."""
    from desktop.services.renting.orphans import burn_rate

    orphans = report.orphans
    names = ", ".join(f"{m.instance.provider.label} {m.instance.name}" for m in orphans)
    if len(orphans) == 1:
        count = "1 rented machine that no run uses still bills"
    else:
        count = f"{len(orphans)} rented machines that no run uses still bill"
    return f"{count} ${burn_rate(report):.2f}/h: {names}."


def unread_text(report: MachinesReport) -> str:
    """What the search for orphans could not read, one line each ("" when it read everything)."""
    if not report.unread:
        return ""
    return "Left out of the search for orphans: " + "; ".join(report.unread) + "."


class OrphansBanner(Banner):
    """Hidden until orphans are found; says what they burn, and terminates them on request (after asking)."""

    sig_stopped = Signal(str)

    def __init__(self, store: RunStore, secrets: SecretStore, parent: QWidget | None = None) -> None:
        super().__init__("warning")
        if parent is not None:
            self.setParent(parent)
        self.store, self.secrets = store, secrets
        self.report: MachinesReport | None = None
        self.setObjectName("orphans_banner")
        self.text = self.headline_label
        self.stop_button = destructive_button("Terminate them…", "circle-stop", "Terminate the orphaned machines")
        self.stop_button.clicked.connect(self.on_stop_clicked)
        self.add_action(self.stop_button)
        self.setAccessibleName("Orphaned machines")
        self.hide()

    def show_report(self, report: MachinesReport) -> None:
        """Shows the banner when the report has orphans, or machines it could not read (hides it otherwise)."""
        self.report = report
        if not report.orphans:
            self.stop_button.hide()
            self.show_message("warning", unread_text(report), UNREAD_DETAILS)
            return
        unread = f"{unread_text(report)} {UNREAD_DETAILS}" if report.unread else ""
        details = " ".join(words for words in (DETAILS, unread) if words)
        self.show_message("warning", orphans_text(report), details)
        self.setAccessibleName("Orphaned machines")
        self.stop_button.show()
        self.stop_button.setEnabled(True)

    def on_stop_clicked(self) -> None:
        """Asks, then terminates the orphans in the background."""
        report = self.report
        if report is None or not report.orphans:
            return
        question = (
            f"{orphans_text(report)}\n\nTerminate them now? Their disks are deleted; no Rentune run uses them "
            "(a run's checkpoints are already on this computer)."
        )
        if confirm(self, "Terminate orphaned machines", question, "&Terminate them", "&Keep them"):
            self.stop_button.setEnabled(False)
            self._terminate(report)

    @asyncSlot()
    async def _terminate(self, report: MachinesReport) -> None:
        from desktop.services.renting.orphans import stop_orphans

        stopped, problems = await stop_orphans(self.store, report, self.secrets)
        words = f"terminated {len(stopped)} orphaned machine{'s' if len(stopped) != 1 else ''}"
        if problems:
            self.show_message("danger", f"{words[0].upper()}{words[1:]}; not terminated: {'; '.join(problems)}")
            self.stop_button.setEnabled(True)
        else:
            self.hide()
        self.sig_stopped.emit(words)
