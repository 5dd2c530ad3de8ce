"""Serving a GGUF from the Models page: the dialog that asks for the port, and the card of the running server.

The card shows where the server answers, how many requests it answered, a request for Python's ``openai`` client and
one for curl (each copyable), and Stop. The page owns the server (through the app's server pool); the card only shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QTabBar,
    QVBoxLayout,
    QWidget,
)

from desktop.services.serving.local_server import DEFAULT_CONTEXT, LocalServer
from desktop.ui.widgets.blocks import Card, caption, destructive_button, heading, plain_button, primary_button

#: The examples the card offers, by the tab's label.
EXAMPLES = (("Python", "python"), ("curl", "curl"))


@dataclass(frozen=True)
class ServeChoice:
    """What to serve and how.

    Attributes:
        model: The GGUF to serve.
        lora: A GGUF LoRA served on top of it, or None.
        port: The port on 127.0.0.1, or None for any free one.
        context: The context window in tokens.
    """

    model: Path
    lora: Path | None
    port: int | None
    context: int


class ServeDialog(QDialog):
    """Asks for the port and the context window before serving ``model``; ``accepted`` means serve."""

    def __init__(self, parent: QWidget, model: Path, lora: Path | None) -> None:
        super().__init__(parent)
        self.model, self.lora = model, lora
        self.setWindowTitle("Serve on this computer")
        self.setAccessibleName("Serve on this computer")
        self.setMinimumWidth(480)
        layout = QVBoxLayout(self)
        layout.setSpacing(12)
        layout.addWidget(heading(f"Serve {model.name}" + (f" with {lora.name}" if lora else "")))
        layout.addWidget(
            caption(
                "An OpenAI-compatible server (llama.cpp's) on 127.0.0.1: programs on this computer call it like "
                "OpenAI's API, with the model's own chat template. Nothing outside this computer can reach it; "
                "it runs until you stop it or close Rentune."
            )
        )
        layout.addLayout(self._form())
        layout.addStretch(1)
        layout.addLayout(self._buttons())

    def _form(self) -> QFormLayout:
        form = QFormLayout()
        self.port_spin = QSpinBox()
        self.port_spin.setRange(0, 65535)
        self.port_spin.setSpecialValueText("Any free port")
        self.port_spin.setAccessibleName("Port, or any free port")
        self.context_spin = QSpinBox()
        self.context_spin.setRange(512, 131072)
        self.context_spin.setSingleStep(512)
        self.context_spin.setValue(DEFAULT_CONTEXT)
        self.context_spin.setSuffix(" tokens")
        self.context_spin.setAccessibleName("Context window in tokens")
        port_label, context_label = QLabel("&Port"), QLabel("Conte&xt window")
        port_label.setBuddy(self.port_spin)
        context_label.setBuddy(self.context_spin)
        form.addRow(port_label, self.port_spin)
        form.addRow(context_label, self.context_spin)
        return form

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addStretch(1)
        cancel = plain_button("Cancel", accessible_name="Close without serving")
        cancel.clicked.connect(self.reject)
        self.serve_button = primary_button("&Serve", "play")
        self.serve_button.setDefault(True)
        self.serve_button.clicked.connect(self.accept)
        row.addWidget(cancel)
        row.addWidget(self.serve_button)
        return row

    def choice(self) -> ServeChoice:
        """What was chosen."""
        port = self.port_spin.value() or None
        return ServeChoice(self.model, self.lora, port, self.context_spin.value())


class ServeCard(Card):
    """The running server: its address, requests answered, copyable examples and Stop (``sig_stop``).

    Signals:
        sig_stop: The user asked to stop the server shown.
    """

    sig_stop = Signal()

    def __init__(self) -> None:
        super().__init__("Serving")
        self.server: LocalServer | None = None
        self.setAccessibleName("Model being served")
        self.stop_button = destructive_button("S&top serving", "circle-stop", "Stop the server")
        self.stop_button.clicked.connect(lambda _checked=False: self.sig_stop.emit())
        self.add_header_widget(self.stop_button)
        self.address_label = QLabel()
        self.address_label.setWordWrap(True)
        self.address_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.address_label.setAccessibleName("Where the server answers")
        self.body.addWidget(self.address_label)
        self.body.addLayout(self._example_row())
        self.example_edit = QPlainTextEdit()
        self.example_edit.setReadOnly(True)
        self.example_edit.setAccessibleName("Example request")
        self.example_edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.example_edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)  # code keeps its lines
        lines = self.example_edit.fontMetrics().lineSpacing()
        self.example_edit.setFixedHeight(lines * 5 + 14)
        self.body.addWidget(self.example_edit)
        self.copied_label = caption()
        self.copied_label.setAccessibleName("What was copied")
        self.body.addWidget(self.copied_label)
        self.hide()

    def _example_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.example_tabs = QTabBar()
        self.example_tabs.setAccessibleName("Example for")
        for label, _key in EXAMPLES:
            self.example_tabs.addTab(label)
        self.example_tabs.currentChanged.connect(lambda _index: self.show_example())
        row.addWidget(self.example_tabs)
        row.addStretch(1)
        self.copy_address_button = plain_button("Copy &address", "copy", "Copy the server's address")
        self.copy_address_button.clicked.connect(lambda _checked=False: self.on_copy_address())
        self.copy_example_button = plain_button("Cop&y example", "copy", "Copy the example request")
        self.copy_example_button.clicked.connect(lambda _checked=False: self.on_copy_example())
        row.addWidget(self.copy_address_button)
        row.addWidget(self.copy_example_button)
        return row

    def show_server(self, server: LocalServer) -> None:
        """Shows ``server`` (and its requests so far)."""
        self.server = server
        assert self.title_label is not None
        self.title_label.setText(f"Serving {server.model.name}")
        self.stop_button.setEnabled(True)
        self.copied_label.setText("Copy the address into any OpenAI client as its base URL; any API key is taken.")
        self.show_example()
        self.refresh()
        self.show()

    def refresh(self) -> None:
        """Shows the requests answered so far."""
        if self.server is None:
            return
        count = self.server.requests
        requests = f"{count} request" + ("" if count == 1 else "s")
        self.address_label.setText(
            f"OpenAI-compatible at <b>{self.server.url}</b> (this computer only) · {requests} answered so far"
        )

    def show_example(self) -> None:
        """Shows the example of the tab chosen."""
        if self.server is not None:
            key = EXAMPLES[max(0, self.example_tabs.currentIndex())][1]
            self.example_edit.setPlainText(self.server.examples()[key])

    def stopping(self) -> None:
        """Says the server is being stopped."""
        self.stop_button.setEnabled(False)
        self.address_label.setText("Stopping the server…")

    def finish(self) -> None:
        """Hides the card."""
        self.server = None
        self.hide()

    def on_copy_address(self) -> None:
        """Copies the base URL (what an OpenAI client's ``base_url`` takes)."""
        if self.server is not None:
            QGuiApplication.clipboard().setText(self.server.url)
            self.copied_label.setText(f"Copied {self.server.url} to the clipboard.")

    def on_copy_example(self) -> None:
        """Copies the example shown."""
        if self.server is not None:
            QGuiApplication.clipboard().setText(self.example_edit.toPlainText())
            label = EXAMPLES[max(0, self.example_tabs.currentIndex())][0]
            self.copied_label.setText(f"Copied the {label} example to the clipboard.")
