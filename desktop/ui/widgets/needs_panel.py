"""What a local step needs before it starts, said with sizes: libraries to install, downloads it will make.

Missing libraries are installed as one pinned set, the local tools: with Install local tools on the Models page or
``rentune tools install`` (shown with a Copy button); Check again re-reads what is installed.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from desktop.services.local.base_model import BaseAvailability, BaseState
from desktop.services.local.llama_cpp_source import CONVERTERS_DOWNLOAD_MB
from desktop.services.local.needs import LocalNeeds
from desktop.services.local.tools import install_commands
from desktop.ui.design.icons import tint
from desktop.ui.widgets.blocks import SEVERITY_ICONS, caption, plain_button, primary_button, severity_color
from desktop.ui.widgets.local_words import size_text, tools_text


def base_line(base: BaseAvailability, download: int | None, asking: bool) -> tuple[str, str]:
    """(severity, sentence) about the base model."""
    name = base.name or ""
    if base.state is BaseState.HERE:
        return "success", f"Base model: {name} is on this computer."
    if base.state is BaseState.DOWNLOAD:
        size = "asking Hugging Face for its size…" if asking else size_text(download) if download else "size unknown"
        return "info", (
            f"Downloads the base model {name} from Hugging Face first ({size}); it is kept in Rentune's cache, so "
            "later steps reuse it."
        )
    if base.state is BaseState.UNNAMED:
        return "danger", "The adapter does not say which base model it was trained on: choose it above."
    if base.state is BaseState.NOT_A_MODEL:
        return "danger", f"{name} has no config.json, so it is not a model folder: choose the base model's folder."
    return "danger", f"{name} is neither a folder on this computer nor a Hugging Face id (like org/name)."


def need_lines(needs: LocalNeeds, asking: bool) -> list[tuple[str, str]]:
    """(severity, sentence) for each thing the steps need, blocking ones first."""
    lines = []
    if needs.impossible:
        lines.append(("danger", f"{needs.impossible}."))
    if needs.missing:
        lines.append(("danger", f"Needs libraries this Python does not have: {tools_text(list(needs.missing))}."))
    if needs.base is not None:
        lines.append(base_line(needs.base, needs.base_bytes, asking))
    if needs.converters:
        lines.append(
            ("info", f"Downloads llama.cpp's GGUF converters once (about {CONVERTERS_DOWNLOAD_MB} MB) from PyPI.")
        )
    if not lines or all(severity == "success" for severity, _ in lines):
        lines.append(("success", "Everything this needs is on this computer."))
    return lines


class NeedsPanel(QFrame):
    """Lists what the chosen steps need.

    ``sig_recheck`` asks the dialog to look again (after an install); ``sig_install_tools`` asks for the local tools.
    """

    sig_recheck = Signal()
    sig_install_tools = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("What this needs")
        self._outer = QVBoxLayout(self)
        self._outer.setContentsMargins(0, 0, 0, 0)
        self._content: QWidget | None = None
        self.lines: list[str] = []
        self.commands: list[str] = []

    def show_needs(self, needs: LocalNeeds, *, asking: bool = False) -> None:
        """Draws ``needs``; ``asking`` while the Hub is being asked for the base model's size."""
        if self._content is not None:
            self._content.deleteLater()
        self._content = QWidget()
        layout = QVBoxLayout(self._content)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        self.lines = []
        for severity, text in need_lines(needs, asking):
            layout.addLayout(self._line(severity, text))
            self.lines.append(text)
        self.commands = install_commands(needs.missing)
        if self.commands:
            layout.addWidget(self._install_box(self.commands))
        self._outer.addWidget(self._content)

    def _line(self, severity: str, text: str) -> QHBoxLayout:
        row = QHBoxLayout()
        picture = QLabel()
        tint(picture, SEVERITY_ICONS[severity], severity_color(severity), 16)
        picture.setAlignment(Qt.AlignmentFlag.AlignTop)
        label = QLabel(text)
        label.setWordWrap(True)
        label.setTextFormat(Qt.TextFormat.PlainText)
        label.setAccessibleName(text)
        row.addWidget(picture)
        row.addWidget(label, 1)
        return row

    def _install_box(self, commands: list[str]) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(22, 0, 0, 0)
        layout.addWidget(caption("Install the local tools now (about 1.5 GB, once), or from a terminal:"))
        command = QLabel("\n".join(commands))
        command.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        command.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        command.setWordWrap(True)
        command.setAccessibleName("Install command")
        layout.addWidget(command)
        row = QHBoxLayout()
        install = primary_button("&Install local tools", "download", "Install the local tools")
        install.clicked.connect(lambda _checked=False: self.sig_install_tools.emit())
        row.addWidget(install)
        copy = plain_button("Cop&y command", "copy", "Copy the install command")
        copy.clicked.connect(lambda _checked=False: QGuiApplication.clipboard().setText("\n".join(commands)))
        again = plain_button("Check a&gain", "refresh-cw", "Check again what is installed")
        again.clicked.connect(lambda _checked=False: self.sig_recheck.emit())
        row.addWidget(copy)
        row.addWidget(again)
        row.addStretch(1)
        layout.addLayout(row)
        return box
