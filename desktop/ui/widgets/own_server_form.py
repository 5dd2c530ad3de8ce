"""Your own server over SSH, tested before a run: the host key pinned, the GPU and Python found (Compute step)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)
from qasync import asyncSlot

from desktop.core.runs.draft import TargetDraft
from desktop.services.machines.probe import ProbeError, ProbeResult, probe_host
from desktop.services.machines.ssh import Endpoint, HostKeyChangedError
from desktop.ui.widgets.blocks import Card, primary_button
from desktop.ui.widgets.number_fields import CorrectionNote

NOT_TESTED = "Not tested yet: press Test connection."
PURPOSE = (
    "Train on a server you own over SSH. Test the connection: its host key is pinned, so the run refuses a machine "
    "that later presents another key."
)


class OwnServerForm(QWidget):
    """An SSH host the user owns, with the host key pinned by Test connection.

    ``sig_changed`` is emitted whenever what the form holds changes (a field edited, a test finished).
    """

    sig_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Your own server")
        self.host_key, self.fingerprint, self.gpu = "", "", ""
        self._pinned_for: tuple[str, int] | None = None
        self._python_ok = True  # until a test finds no working interpreter
        self._test_task: asyncio.Future[None] | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(10)
        layout.addWidget(self._build_form())
        layout.addWidget(self._build_test())

    # -- building ------------------------------------------------------------------------------------------------

    def _line(self, accessible: str, placeholder: str = "") -> QLineEdit:
        edit = QLineEdit()
        edit.setAccessibleName(accessible)
        edit.setPlaceholderText(placeholder)
        edit.textEdited.connect(lambda _text: self.sig_changed.emit())
        return edit

    def _build_form(self) -> Card:
        card = Card("Your server over SSH", PURPOSE)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
        card.body.addLayout(form)
        self.host_edit = self._line("Host name or address", "gpu.example.com or 203.0.113.7")
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(22)
        self.port_spin.setAccessibleName("SSH port")
        self.user_edit = self._line("User name", "the login user")
        self.key_edit = self._line("Private key file", "empty: your SSH agent or ~/.ssh/id_*")
        self.key_button = QPushButton("Ch&oose…")
        self.key_button.setAccessibleName("Choose the private key file")
        self.key_button.clicked.connect(self.on_choose_key_clicked)
        key_row = QHBoxLayout()
        key_row.addWidget(self.key_edit, 1)
        key_row.addWidget(self.key_button)
        self.python_edit = self._line("Python interpreter on the server", "python3")
        self.workdir_edit = self._line("Remote work folder (optional)", "~/.rentune/runs")
        self.authorized_edit = self._line(
            "Server's authorized_keys file (advanced, optional)", "~/.ssh/authorized_keys"
        )
        self.rate_spin = QDoubleSpinBox()
        self.rate_spin.setRange(0.0, 1000.0)
        self.rate_spin.setDecimals(2)
        self.rate_spin.setPrefix("$ ")
        self.rate_spin.setSuffix(" per hour")
        self.rate_spin.setAccessibleName("Hourly rate in US dollars, for the cost meter")
        self.rate_spin.valueChanged.connect(lambda _value: self.sig_changed.emit())
        self.host_edit.textEdited.connect(self.on_address_changed)
        self.port_spin.valueChanged.connect(self.on_address_changed)
        self.port_spin.valueChanged.connect(lambda _value: self.sig_changed.emit())
        form.addRow("&Host", self.host_edit)
        form.addRow("&Port", self.port_spin)
        form.addRow("&User", self.user_edit)
        key_label = QLabel("&Key file")
        key_label.setBuddy(self.key_edit)  # a row holding a layout gets no buddy by itself
        form.addRow(key_label, key_row)
        form.addRow("P&ython", self.python_edit)
        form.addRow("Remote &work folder", self.workdir_edit)
        form.addRow("&authorized_keys (advanced)", self.authorized_edit)
        form.addRow("Hourly &rate (USD)", self.rate_spin)
        self.correction_note = CorrectionNote()
        self.correction_note.watch(self.port_spin, "Port")
        self.correction_note.watch(self.rate_spin, "Hourly rate")
        form.addRow("", self.correction_note)
        width = self.fontMetrics().horizontalAdvance("M") * 30
        for edit in (self.host_edit, self.user_edit, self.python_edit, self.workdir_edit, self.authorized_edit):
            edit.setMinimumWidth(width)
        self.key_edit.setMinimumWidth(width - self.key_button.sizeHint().width() - 6)
        for spin in (self.port_spin, self.rate_spin):
            spin.setMinimumWidth(self.fontMetrics().horizontalAdvance("$ 1,000.00 per hour") + 40)
        return card

    def _build_test(self) -> Card:
        card = Card("Connection")
        form = QFormLayout()
        card.body.addLayout(form)
        self.test_button = primary_button(
            "&Test connection", "activity", "Test the SSH connection and pin the host key"
        )
        self.test_button.clicked.connect(self.on_test_clicked)
        self.forget_button = QPushButton("&Forget pinned key")
        self.forget_button.setAccessibleName("Forget the pinned host key")
        self.forget_button.clicked.connect(self.on_forget_clicked)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy indicator
        self.progress.setAccessibleName("Testing the connection")
        self.progress.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.test_button)
        row.addWidget(self.forget_button)
        self.progress.setMaximumWidth(200)
        row.addWidget(self.progress)
        row.addStretch(1)
        self.status_label = self._result_label("Connection test result")
        self.fingerprint_label = self._result_label("Pinned host key fingerprint")
        self.gpu_label = self._result_label("GPU found on the server")
        self.python_label = self._result_label("Python and torch on the server")
        form.addRow(row)
        form.addRow("Result", self.status_label)
        form.addRow("Host key", self.fingerprint_label)
        form.addRow("GPU", self.gpu_label)
        form.addRow("Python", self.python_label)
        return card

    @staticmethod
    def _result_label(accessible: str) -> QLabel:
        label = QLabel()
        label.setWordWrap(True)
        label.setAccessibleName(accessible)
        return label

    # -- the draft ----------------------------------------------------------------------------------------------------

    def show_target(self, target: TargetDraft, hourly_rate_usd: float) -> None:
        """Fills the form from the draft's server, with its pinned key, and its hourly rate."""
        for widget, value in (
            (self.host_edit, target.host),
            (self.user_edit, target.user),
            (self.key_edit, target.identity),
            (self.python_edit, target.python),
            (self.workdir_edit, target.workdir),
            (self.authorized_edit, target.authorized_keys),
        ):
            widget.setText(value)
        self.port_spin.blockSignals(True)
        self.port_spin.setValue(target.port)
        self.port_spin.blockSignals(False)
        self.rate_spin.setValue(hourly_rate_usd)
        self._set_pin(target.host_key, target.fingerprint, target.gpu)
        if target.host_key:
            self.status_label.setText("Tested earlier; test again to check the server now.")
            self.python_label.setText("Test the connection again to check Python and torch.")
        else:
            self.status_label.clear()

    def validate(self) -> str | None:
        """Host and user are required, and the connection must have been tested (host key pinned)."""
        if not self.host_edit.text().strip():
            return "Enter the server's host name or address."
        if not self.user_edit.text().strip():
            return "Enter the user name to log in with."
        if not self.host_key:
            return "Press Test connection: the server's host key must be pinned before a run can use it."
        if not self._python_ok:
            return (
                "The server has no working Python at that path: fix the Python interpreter (e.g. python3 or the "
                "full path of the image's Python) and press Test connection again."
            )
        return None

    def hourly_rate(self) -> float:
        """The server's hourly rate as entered (0: not metered)."""
        return float(self.rate_spin.value())

    def target_draft(self) -> TargetDraft:
        """The target as the form shows it, with the pinned key."""
        return TargetDraft(
            host=self.host_edit.text().strip(),
            port=self.port_spin.value(),
            user=self.user_edit.text().strip(),
            identity=self.key_edit.text().strip(),
            python=self.python_edit.text().strip() or "python3",
            workdir=self.workdir_edit.text().strip(),
            authorized_keys=self.authorized_edit.text().strip(),
            host_key=self.host_key,
            fingerprint=self.fingerprint,
            gpu=self.gpu,
        )

    # -- pinning -------------------------------------------------------------------------------------------------

    def _set_pin(self, host_key: str, fingerprint: str, gpu: str, python: str = "") -> None:
        self.host_key, self.fingerprint, self.gpu = host_key, fingerprint, gpu
        self._pinned_for = (self.host_edit.text().strip(), self.port_spin.value()) if host_key else None
        self.fingerprint_label.setText(f"{fingerprint} (pinned)" if host_key else NOT_TESTED)
        self.gpu_label.setText(gpu)
        self.python_label.setText(python)
        self.forget_button.setEnabled(bool(host_key))

    def on_address_changed(self) -> None:
        """Another host or port is another machine: its key must be tested and pinned anew."""
        if self._pinned_for and self._pinned_for != (self.host_edit.text().strip(), self.port_spin.value()):
            self._set_pin("", "", "")
            self.status_label.setText("The host or port changed: test the connection again.")

    def on_forget_clicked(self) -> None:
        """Drops the pinned key (after the user decided to trust a reinstalled server)."""
        self._set_pin("", "", "")
        self.status_label.setText("Pinned key forgotten: the next test pins the key the server offers.")
        self.sig_changed.emit()

    def on_choose_key_clicked(self) -> None:
        """Lets the user pick the private key file."""
        start = self.key_edit.text().strip() or str(Path.home() / ".ssh")
        path, _ = QFileDialog.getOpenFileName(self, "Choose your SSH private key (not the .pub file)", start)
        if path:
            self.key_edit.setText(path)
            self.sig_changed.emit()

    def _endpoint(self) -> Endpoint:
        identity = self.key_edit.text().strip()
        keys = (Path(identity).expanduser(),) if identity else ()
        return Endpoint(self.host_edit.text().strip(), self.port_spin.value(), self.user_edit.text().strip(), keys)

    def on_test_clicked(self) -> None:
        """Starts the connection test; the button stays disabled (and the progress shown) until it ends."""
        if not self.host_edit.text().strip() or not self.user_edit.text().strip():
            self.status_label.setText("Enter the host and the user first.")
            return
        self.test_button.setEnabled(False)
        self.progress.setVisible(True)
        self.status_label.setText(f"Connecting to {self.host_edit.text().strip()}…")
        self._test_task = self._run_test()

    @asyncSlot()
    async def _run_test(self) -> None:
        """Logs in (pinning the host key on first use) and shows the key's fingerprint, the GPU, Python and torch."""
        endpoint = self._endpoint()
        try:
            python = self.python_edit.text().strip() or "python3"
            result = await probe_host(endpoint, self.host_key or None, python)
        except (HostKeyChangedError, ProbeError) as exc:
            self.status_label.setText(f"Connection failed: {exc}.")
            return
        finally:
            self.test_button.setEnabled(True)
            self.progress.setVisible(False)
        now = self._endpoint()
        if (now.host, now.port, now.user) != (endpoint.host, endpoint.port, endpoint.user):
            self.status_label.setText("The address changed during the test; press Test connection again.")
            return  # never pin one server's key for another address
        self._show_result(result)
        self._python_ok = bool(result.python_version)

    def _show_result(self, result: ProbeResult) -> None:
        self._set_pin(result.host_key, result.fingerprint, result.gpu_summary, result.python_summary)
        self.status_label.setText(
            "Connected: host key pinned." + ("" if result.python_version else " Fix the Python interpreter below.")
        )
        self.sig_changed.emit()
