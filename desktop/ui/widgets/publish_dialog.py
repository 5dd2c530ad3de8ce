"""Asks where to publish an adapter on the Hugging Face Hub and what to add to it; ``accepted`` means publish."""

from __future__ import annotations

import re

from PySide6.QtWidgets import QCheckBox, QDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QVBoxLayout, QWidget

from desktop.core.model_names import model_name
from desktop.services.local.inventory import ExportedItem, ExportKind
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.publishing.hub import PublishRequest, repo_problem
from desktop.services.runs.adapters import ReturnedAdapter
from desktop.ui.app_words import sentence
from desktop.ui.widgets.blocks import caption, heading, plain_button, primary_button
from desktop.ui.widgets.local_words import adapter_title, item_name, kind_text, size_text


def default_repo(adapter: ReturnedAdapter) -> str:
    """``Qwen2.5-7B-Instruct-rentune-f3fb``: the base model's short name and the run id's end, as the Hub allows."""
    base = model_name(adapter.source.base).rsplit("/", 1)[-1] if adapter.source.base else "model"
    name = f"{base}-rentune-{adapter.run_id.rsplit('-', 1)[-1]}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")
    return re.sub(r"-{2,}", "-", name)[:96] or "rentune-adapter"


class PublishDialog(QDialog):
    """The repo name, private or public, and which exports go with the adapter; says what is missing first."""

    def __init__(self, parent: QWidget, adapter: ReturnedAdapter, secrets: SecretStore) -> None:
        super().__init__(parent)
        self.adapter = adapter
        self.setWindowTitle("Publish to the Hugging Face Hub")
        self.setAccessibleName("Publish to the Hugging Face Hub")
        self.setMinimumWidth(540)
        layout = QVBoxLayout(self)
        layout.setSpacing(12)
        layout.addWidget(heading("Publish to the Hugging Face Hub"))
        layout.addWidget(caption(sentence(adapter_title(adapter))))
        layout.addWidget(
            caption(
                "The adapter goes with a model card written from the run: base model, settings, data size (never "
                "its rows), the loss curve, the comparison with the base if you ran one, GPU, time and cost."
            )
        )
        layout.addLayout(self._form())
        self.export_checks = self._exports(layout)
        token = secrets.status(SecretName.HUGGINGFACE)
        self.token_missing = not token.usable
        self.hint_label = caption()
        layout.addWidget(self.hint_label)
        layout.addStretch(1)
        layout.addLayout(self._buttons())
        self.refresh()

    def _form(self) -> QFormLayout:
        form = QFormLayout()
        self.repo_edit = QLineEdit(default_repo(self.adapter))
        self.repo_edit.setAccessibleName("Repository name")
        self.repo_edit.setPlaceholderText("owner/name, or name for your own account")
        self.repo_edit.textChanged.connect(lambda _text: self.refresh())
        label = QLabel("&Repository")
        label.setBuddy(self.repo_edit)
        form.addRow(label, self.repo_edit)
        self.private_check = QCheckBox("Pri&vate: only you (and your organisation) can see it")
        self.private_check.setChecked(True)
        form.addRow("", self.private_check)
        return form

    def _exports(self, layout: QVBoxLayout) -> dict[QCheckBox, ExportedItem]:
        items = [
            item
            for item in self.adapter.exports
            if (item.kind is ExportKind.GGUF and not item.of_base and not item.damaged)
            or item.kind is ExportKind.MERGED
        ]
        checks: dict[QCheckBox, ExportedItem] = {}
        if items:
            layout.addWidget(caption("Also publish (each is uploaded in full):"))
        for item in items:
            check = QCheckBox(f"{kind_text(item)}: {item_name(item)} ({size_text(item.bytes)})")
            check.toggled.connect(lambda _on: self.refresh())
            layout.addWidget(check)
            checks[check] = item
        return checks

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addStretch(1)
        cancel = plain_button("Cancel", accessible_name="Close without publishing")
        cancel.clicked.connect(self.reject)
        self.publish_button = primary_button("&Publish", "cloud")
        self.publish_button.setDefault(True)
        self.publish_button.clicked.connect(self.accept)
        row.addWidget(cancel)
        row.addWidget(self.publish_button)
        return row

    def problem(self) -> str:
        """What stops publishing now ("" when nothing does)."""
        if self.token_missing:
            return "Add a Hugging Face token with write access in Settings first: the Hub needs it to create the repo."
        repo = self.repo_edit.text().strip()
        if not repo:
            return "Name the repository."
        return sentence(repo_problem(repo)) if repo_problem(repo) else ""

    def refresh(self) -> None:
        """Says what stops publishing, or how much is sent, and enables Publish accordingly."""
        problem = self.problem()
        sent = sum(item.bytes or 0 for check, item in self.export_checks.items() if check.isChecked())
        sent += self.adapter.bytes
        self.hint_label.setText(problem or f"About {size_text(sent)} to upload, then one commit.")
        self.publish_button.setEnabled(not problem)

    def request(self) -> PublishRequest:
        """What was chosen."""
        exports = tuple(item.path for check, item in self.export_checks.items() if check.isChecked())
        return PublishRequest(
            self.repo_edit.text().strip(), self.adapter.source, exports, self.private_check.isChecked()
        )
