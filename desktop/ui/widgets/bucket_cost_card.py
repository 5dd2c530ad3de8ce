"""Costs' Storage card: what the user's bucket holds under Rentune's prefix and what that costs a month."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget

from desktop.core.settings import SettingsError
from desktop.core.storage import StorageSettings
from desktop.services.buckets.client import BucketError, bucket_keys
from desktop.services.buckets.inventory import BucketUsage, bucket_usage
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import load_settings
from desktop.ui.background import Operation
from desktop.ui.widgets.blocks import Card, caption


class BucketCostCard(Card):
    """Reads the bucket's contents off the UI thread when asked (the page shows) and says their monthly cost."""

    def __init__(self, secrets: SecretStore, parent: QWidget | None = None) -> None:
        super().__init__(
            "Storage", "Your bucket's checkpoints and data, priced at the store's rate per GB-month.", parent
        )
        self.secrets = secrets
        self.summary = QLabel("No bucket set up: add one under Storage bucket in Settings.")
        self.summary.setWordWrap(True)
        self.summary.setAccessibleName("Bucket storage and its monthly cost")
        self.detail = caption()
        self.detail.setWordWrap(True)
        self.body.addWidget(self.summary)
        self.body.addWidget(self.detail)

    def refresh(self) -> None:
        """Lists the bucket again (off the UI thread); says why when it cannot."""
        secrets = self.secrets

        def read(_job: object) -> tuple[StorageSettings, BucketUsage | None]:
            storage = load_settings().storage
            return storage, bucket_usage(storage, bucket_keys(secrets)) if storage.configured else None

        Operation(self, read, self._show, group="bucket").failure(self._failed, BucketError, SettingsError).run()

    def _show(self, found: tuple[StorageSettings, BucketUsage | None]) -> None:
        storage, usage = found
        if usage is None:
            self.summary.setText("No bucket set up: add one under Storage bucket in Settings.")
            self.detail.setText("")
            return
        checkpoints = sum(c.bytes for steps in usage.checkpoints.values() for c in steps.values())
        monthly = usage.monthly_usd(storage.price_per_gb_month)
        self.summary.setText(f"{storage.url} holds {usage.total_bytes / 1e9:,.2f} GB: about ${monthly:,.2f} a month.")
        self.detail.setText(
            f"Checkpoints {checkpoints / 1e9:,.2f} GB of {len(usage.checkpoints)} run(s), data "
            f"{usage.data_bytes / 1e9:,.2f} GB; at ${storage.price_per_gb_month:g} per GB-month (rentune storage set "
            f"--price). Each run keeps its newest {storage.keep_checkpoints} checkpoint(s) there."
        )

    def _failed(self, exc: Exception) -> None:
        self.summary.setText(f"The bucket cannot be read: {exc}")
        self.detail.setText("")
