"""Settings' Storage card: the user's bucket (address, endpoint, region), saved, and checked before a run uses it."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QFormLayout, QHBoxLayout, QLineEdit, QWidget

from desktop.core.settings import SettingsError
from desktop.core.storage import StorageSettings
from desktop.services.buckets.check import BucketCheck, check_bucket
from desktop.services.buckets.client import BucketError, bucket_keys
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import update_settings
from desktop.ui.background import Operation
from desktop.ui.widgets.blocks import Card, caption, plain_button, primary_button

_FIELD_WIDTH = 420


class StorageCard(Card):
    """Edits the Storage settings and checks the bucket with the keys from the keyring (write, read back, delete)."""

    sig_saved = Signal(object)

    def __init__(self, storage: StorageSettings, secrets: SecretStore, parent: QWidget | None = None) -> None:
        super().__init__(
            "Storage bucket",
            "An S3-compatible bucket of yours (S3, R2, B2, Wasabi, MinIO) near the GPUs. Its access key ID and secret "
            "key are kept under API keys above; they never leave this computer.",
            parent,
        )
        self.storage, self.secrets = storage, secrets
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        self.url_edit = self._field("s3://my-bucket/rentune", "Bucket address")
        self.endpoint_edit = self._field("empty for AWS; https://<account>.r2.cloudflarestorage.com for R2", "Endpoint")
        self.region_edit = self._field("us-east-1 (R2: auto)", "Region")
        form.addRow("&Bucket", self.url_edit)
        form.addRow("E&ndpoint", self.endpoint_edit)
        form.addRow("Re&gion", self.region_edit)
        self.home_box = QCheckBox("Bring a full fine-tune's checkpoints home too")
        self.home_box.setAccessibleName("Bring a full fine-tune's checkpoints home too")
        self.home_box.setToolTip(
            "A full fine-tune's checkpoints are the whole model: by default they stay in the bucket, and a resume "
            "fetches them there. LoRA and QLoRA checkpoints always come home."
        )
        form.addRow("", self.home_box)
        self.body.addLayout(form)
        row = QHBoxLayout()
        self.save_button = primary_button("Save bucket", "circle-check", "Save the bucket settings")
        self.check_button = plain_button("Chec&k bucket", "list-checks", "Write, read back and delete a test object")
        self.save_button.clicked.connect(self.on_save_clicked)
        self.check_button.clicked.connect(self.on_check_clicked)
        row.addWidget(self.save_button)
        row.addWidget(self.check_button)
        row.addStretch(1)
        self.body.addLayout(row)
        self.status = caption()
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Storage messages")
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.body.addWidget(self.status)
        self._show(storage)

    def _field(self, placeholder: str, name: str) -> QLineEdit:
        field = QLineEdit()
        field.setPlaceholderText(placeholder)
        field.setAccessibleName(name)
        field.setMaximumWidth(_FIELD_WIDTH * 2)
        field.setMinimumWidth(_FIELD_WIDTH // 2)
        return field

    def _show(self, storage: StorageSettings) -> None:
        self.url_edit.setText(storage.url)
        self.endpoint_edit.setText(storage.endpoint)
        self.region_edit.setText(storage.region)
        self.home_box.setChecked(storage.full_checkpoints_home)
        self.check_button.setEnabled(storage.configured)

    def edited(self) -> StorageSettings:
        """The fields as settings.

        Raises:
            ValidationError: A field holds what no store takes; its message names the field and the fix.
        """
        typed = {
            "url": self.url_edit.text(),
            "endpoint": self.endpoint_edit.text(),
            "region": self.region_edit.text().strip().lower(),
            "full_checkpoints_home": self.home_box.isChecked(),
        }
        return StorageSettings(**{**self.storage.model_dump(), **typed})  # keeps what rentune storage set added

    def on_save_clicked(self) -> None:
        """Saves the bucket settings (off the UI thread); a field no store takes is said, and nothing is saved."""
        try:
            storage = self.edited()
        except ValidationError as exc:
            first = exc.errors()[0]
            self.status.setText(f"Not saved: {first['loc'][0]}: {str(first['msg']).removeprefix('Value error, ')}")
            return

        def save(_job: object) -> Path:
            return update_settings({"storage": storage.model_dump()})

        Operation(self, save, lambda _path: self._saved(storage)).failure(self._failed, OSError, SettingsError).run()

    def _saved(self, storage: StorageSettings) -> None:
        self.storage = storage
        self._show(storage)
        words = f"Saved: {storage.url} at {storage.endpoint or 'AWS'}." if storage.configured else "No bucket set up."
        self.status.setText(words + (" Check bucket proves it works." if storage.configured else ""))
        self.sig_saved.emit(storage)

    def on_check_clicked(self) -> None:
        """Checks the saved bucket off the UI thread: writes, reads back and deletes a test object."""
        storage, secrets = self.storage, self.secrets
        self.check_button.setEnabled(False)
        self.status.setText(f"Checking {storage.url}: writing, reading back and deleting a test object…")

        def check(_job: object) -> BucketCheck:
            return check_bucket(storage, bucket_keys(secrets))

        Operation(self, check, self._checked).failure(self._failed, BucketError).run()

    def _checked(self, result: BucketCheck) -> None:
        self.check_button.setEnabled(True)
        self.status.setText(f"Works: {result.words()}.")

    def _failed(self, exc: Exception) -> None:
        self.check_button.setEnabled(self.storage.configured)
        self.status.setText(f"The bucket cannot be used: {exc}")
