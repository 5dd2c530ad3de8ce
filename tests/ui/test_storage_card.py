"""Settings' Storage card as a user drives it: the bucket typed in and saved (a bad address refused in words), its keys
under API keys, and Check bucket against a real S3-compatible store (SeaweedFS on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.platform.settings import load_settings
from desktop.ui.pages.settings_page import SettingsPage
from tests.fixtures.s3_server import S3Server


@pytest.fixture
def page(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> SettingsPage:
    widget = SettingsPage(Settings(), SecretStore())
    qtbot.addWidget(widget)
    widget.resize(1100, 900)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def type_into(qtbot: QtBot, field: object, text: str) -> None:
    field.setFocus()  # type: ignore[attr-defined]
    field.selectAll()  # type: ignore[attr-defined]
    qtbot.keyClicks(field, text)


def test_a_bucket_typed_in_is_saved_checked_and_a_bad_address_is_refused_in_words(
    page: SettingsPage, qtbot: QtBot, wait_for: Callable[..., None], s3_server: S3Server
) -> None:
    card = page.storage_card
    assert not card.check_button.isEnabled(), "nothing to check before a bucket is saved"
    type_into(qtbot, card.url_edit, "https://my-bucket")
    qtbot.mouseClick(card.save_button, Qt.MouseButton.LeftButton)
    assert card.status.text().startswith("Not saved: url: bucket 'https://my-bucket' is not an s3:// address")
    assert not load_settings().storage.configured, "nothing saved"
    type_into(qtbot, card.url_edit, f"s3://{s3_server.bucket}/rentune")
    type_into(qtbot, card.endpoint_edit, s3_server.endpoint)
    assert not card.home_box.isChecked(), "a full fine-tune's checkpoints stay in the bucket unless asked"
    card.home_box.click()
    qtbot.mouseClick(card.save_button, Qt.MouseButton.LeftButton)
    wait_for(lambda: card.status.text().startswith("Saved:"))
    assert load_settings().storage.url == f"s3://{s3_server.bucket}/rentune"
    assert load_settings().storage.full_checkpoints_home
    assert page.settings.storage.endpoint == s3_server.endpoint
    qtbot.mouseClick(card.check_button, Qt.MouseButton.LeftButton)
    wait_for(lambda: card.status.text().startswith("The bucket cannot be used"), 30)
    assert "no Bucket access key ID is set: save it under API keys in Settings" in card.status.text()
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    qtbot.mouseClick(card.check_button, Qt.MouseButton.LeftButton)
    wait_for(lambda: card.status.text().startswith("Works:"), 30)
    assert card.status.text().startswith(
        f"Works: wrote, read back and deleted a test object in s3://{s3_server.bucket}/rentune at {s3_server.endpoint}"
    )
    assert card.check_button.isEnabled()


def test_the_costs_storage_card_says_what_the_bucket_holds_and_costs_a_month(
    qtbot: QtBot, wait_for: Callable[..., None], s3_server: S3Server
) -> None:
    from desktop.core.storage import StorageSettings
    from desktop.services.platform.settings import save_settings
    from desktop.ui.widgets.bucket_cost_card import BucketCostCard

    card = BucketCostCard(SecretStore())
    qtbot.addWidget(card)
    card.refresh()
    wait_for(lambda: card.summary.text().startswith("No bucket set up"))
    storage = StorageSettings(url=f"s3://{s3_server.bucket}/team", endpoint=s3_server.endpoint, price_per_gb_month=2)
    save_settings(Settings(storage=storage))
    card.refresh()
    wait_for(lambda: card.summary.text().startswith("The bucket cannot be read: no Bucket access key ID is set"))
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    key = "team/runs/r1/checkpoints/checkpoint-3/adapter_model.safetensors"
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=b"w" * 30_000_000)
    card.refresh()
    wait_for(lambda: "holds" in card.summary.text(), 30)
    assert card.summary.text() == f"s3://{s3_server.bucket}/team holds 0.03 GB: about $0.06 a month."
    assert card.detail.text().startswith("Checkpoints 0.03 GB of 1 run(s), data 0.00 GB; at $2 per GB-month")
