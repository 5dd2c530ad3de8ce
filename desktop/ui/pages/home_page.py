"""The start page: what Rentune does, the steps of a fine-tune, and what this computer is ready for."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from qasync import asyncSlot

from desktop.services.platform.environment import EnvironmentCheck, check_environment
from desktop.ui.background import off_ui_thread
from desktop.ui.pages.base import BasePage

FLOW_STEPS = [
    ("Check the data", "on this computer, before any GPU is billing"),
    ("Size the job", "memory per GPU, GPU count, hours and dollars for QLoRA, LoRA or a full fine-tune"),
    ("Connect your GPU server", "any machine you reach over SSH; its host key is pinned on the first test"),
    ("Train", "detached on the machine; progress streams here, checkpoints come home as they are written"),
    ("Bring the adapter home", "verified on your disk; then stop or release the machine at your provider"),
]


class HomePage(BasePage):
    """Welcomes the user and reports which local tools are installed."""

    page_name = "home"
    title = "Welcome to Rentune"
    icon_name = "house"
    purpose = (
        "Fine-tune open LLMs on a GPU server you rent and pay only for training: data is checked and the job is "
        "sized before the card bills, and checkpoints come home while it trains."
    )
    sig_environment_checked = Signal(list)

    def __init__(self, parent: QWidget | None = None, banner: QWidget | None = None) -> None:
        super().__init__(parent)
        if banner is not None:
            self.body.addWidget(banner)  # orphaned machines: the first thing to see when something bills for nothing
        self.body.addWidget(self._build_flow())
        self.body.addWidget(self._build_environment(), 1)

    def _build_flow(self) -> QGroupBox:
        box = QGroupBox("How a fine-tune goes")
        layout = QVBoxLayout(box)
        for number, (step, detail) in enumerate(FLOW_STEPS, start=1):
            label = QLabel(f"<b>{number}. {step}</b> — {detail}")
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setWordWrap(True)
            layout.addWidget(label)
        return box

    def _build_environment(self) -> QGroupBox:
        box = QGroupBox("This computer")
        layout = QVBoxLayout(box)
        self.environment_table = QTableWidget(0, 3)
        self.environment_table.setAccessibleName("Environment checks")
        self.environment_table.setHorizontalHeaderLabels(["Component", "Found", "To fix"])
        self.environment_table.verticalHeader().setVisible(False)
        self.environment_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        header = self.environment_table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(self.environment_table)
        row = QHBoxLayout()
        self.environment_summary = QLabel("Checking…")
        self.recheck_button = QPushButton("Check again")
        self.recheck_button.setAccessibleName("Check this computer again")
        self.recheck_button.clicked.connect(self.on_recheck_clicked)
        row.addWidget(self.environment_summary, 1)
        row.addWidget(self.recheck_button)
        layout.addLayout(row)
        return box

    async def load(self) -> None:
        """Runs the environment check off the UI thread (probing the keyring can block) and shows the result."""
        self.recheck_button.setEnabled(False)
        self.environment_summary.setText("Checking…")
        try:
            checks = await off_ui_thread(self, check_environment)
        finally:
            self.recheck_button.setEnabled(True)
        self._show_checks(checks)
        self.sig_environment_checked.emit(checks)

    @asyncSlot()
    async def on_recheck_clicked(self) -> None:
        """Re-runs the environment check."""
        await self.load()

    def _show_checks(self, checks: list[EnvironmentCheck]) -> None:
        table = self.environment_table
        table.setRowCount(len(checks))
        for row, check in enumerate(checks):
            mark = "✔" if check.ok else ("✖" if check.required else "·")
            table.setItem(row, 0, QTableWidgetItem(f"{mark}  {check.name}"))
            table.setItem(row, 1, QTableWidgetItem(check.detail))
            table.setItem(row, 2, QTableWidgetItem(check.fix))
        missing_required = [c.name for c in checks if c.required and not c.ok]
        if missing_required:
            self.environment_summary.setText("Needs attention: " + ", ".join(missing_required))
        else:
            optional = sum(1 for c in checks if c.is_tool and c.ok)
            total = sum(1 for c in checks if c.is_tool)
            self.environment_summary.setText(f"Ready. Optional tools installed: {optional} of {total}.")
