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
    qtbot.mouseClick(card.save_button, Qt.MouseButton.LeftButton)
    wait_for(lambda: card.status.text().startswith("Saved:"))
    assert load_settings().storage.url == f"s3://{s3_server.bucket}/rentune"
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
