"""The Models page's line about the local tools: installed or not, how big, and Install / Remove."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from desktop.services.local.toolenv import ToolsState, ToolsStatus
from desktop.ui.widgets.blocks import Badge, caption, destructive_button, plain_button
from desktop.ui.widgets.local_words import size_text

_BADGES = {
    ToolsState.ABSENT: ("Local tools not installed", "info"),
    ToolsState.PARTIAL: ("Local tools: install interrupted", "warning"),
    ToolsState.INSTALLED: ("Local tools installed", "success"),
    ToolsState.OUTDATED: ("Local tools: an update is ready", "warning"),
    ToolsState.OTHER_PYTHON: ("Local tools: for another Python", "warning"),
}


def tools_words(status: ToolsStatus, built_in: bool) -> str:
    """One sentence about the environment for the bar."""
    if status.state is ToolsState.INSTALLED:
        listed = ", ".join(f"{name} {version}" for name, version in list(status.packages.items())[:3])
        return f"{size_text(status.size_bytes)} in {status.folder}" + (f" ({listed})." if listed else ".")
    if built_in:
        return "This Rentune has the local tools in its own Python: merge, export and chat work now."
    if status.state is ToolsState.PARTIAL:
        return f"An install stopped before it finished ({size_text(status.size_bytes)} so far): Install finishes it."
    if status.state is ToolsState.OUTDATED:
        return (
            "Installed by an earlier Rentune: they work; Update adds what this one uses (the trial's trainer) "
            "and keeps the rest."
        )
    if status.state is ToolsState.OTHER_PYTHON:
        return "They were installed for another version of Rentune's Python: Install replaces them."
    return "Merge, GGUF export and chat need them: about 1.5 GB, installed once into Rentune's data folder."


class ToolsBar(QWidget):
    """Shows :class:`ToolsStatus`; ``sig_install`` and ``sig_remove`` ask the page to act."""

    sig_install = Signal()
    sig_remove = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Local tools")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.badge = Badge("Local tools", "info")
        self.detail_label: QLabel = caption()
        self.detail_label.setWordWrap(True)
        self.install_button = plain_button("&Install local tools…", "download", "Install the local tools")
        self.remove_button = destructive_button("Remo&ve tools…", "trash-2", "Remove the local tools")
        self.install_button.clicked.connect(lambda _checked=False: self.sig_install.emit())
        self.remove_button.clicked.connect(lambda _checked=False: self.sig_remove.emit())
        row.addWidget(self.badge)
        row.addWidget(self.detail_label, 1)
        row.addWidget(self.install_button)
        row.addWidget(self.remove_button)
        self.status: ToolsStatus | None = None

    def show_status(self, status: ToolsStatus, *, built_in: bool, busy: bool = False) -> None:
        """Draws ``status``; ``built_in`` when this Python has the tools itself; ``busy`` while a step runs."""
        self.status = status
        text, severity = _BADGES[status.state]
        if built_in and status.state is not ToolsState.INSTALLED:
            text, severity = "Local tools built in", "success"
        self.badge.show_state(text, severity)
        self.detail_label.setText(tools_words(status, built_in))
        self.install_button.setVisible(status.state is not ToolsState.INSTALLED and not built_in)
        outdated = status.state is ToolsState.OUTDATED
        self.install_button.setText("&Update local tools…" if outdated else "&Install local tools…")
        self.install_button.setEnabled(not busy)
        self.remove_button.setVisible(status.state is not ToolsState.ABSENT)
        self.remove_button.setEnabled(not busy)
