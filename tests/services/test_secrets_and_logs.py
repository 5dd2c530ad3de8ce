from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import keyring
import keyring.backends.fail
import pytest

from desktop.services.platform.logs import LOG_FILE_NAME, configure_logging, get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretName, SecretSource, SecretStore, SecretStoreError
from tests.fixtures.memory_keyring import MemoryKeyring

KEY = "rk_live_" + "Z9y8X7w6V5u4T3s2"


@pytest.fixture
def no_keyring() -> Iterator[None]:
    previous = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.fail.Keyring())
    yield
    keyring.set_keyring(previous)


def test_keys_are_stored_in_the_keyring_only(memory_keyring: MemoryKeyring, rentune_home: Path) -> None:
    store = SecretStore()
    store.set(SecretName.RUNPOD, f"  {KEY}\n")
    assert memory_keyring.passwords == {("rentune", "runpod"): KEY}
    assert store.get(SecretName.RUNPOD) == KEY
    assert store.status(SecretName.RUNPOD).source is SecretSource.KEYRING
    assert not any(KEY in p.read_text(errors="ignore") for p in rentune_home.rglob("*") if p.is_file())


def test_environment_variables_win_for_headless_use(monkeypatch: pytest.MonkeyPatch) -> None:
    store = SecretStore()
    store.set(SecretName.HUGGINGFACE, "hf_from_the_keyring_123")
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment_456")
    assert store.get(SecretName.HUGGINGFACE) == "hf_from_the_environment_456"
    assert store.status(SecretName.HUGGINGFACE).source is SecretSource.ENVIRONMENT


def test_delete_and_missing() -> None:
    store = SecretStore()
    store.set(SecretName.VAST, KEY)
    store.delete(SecretName.VAST)
    store.delete(SecretName.VAST)  # deleting twice is fine
    assert store.get(SecretName.VAST) is None
    assert store.status(SecretName.VAST).source is SecretSource.MISSING


def test_empty_key_is_refused() -> None:
    with pytest.raises(SecretStoreError, match="empty"):
        SecretStore().set(SecretName.LAMBDA, "   ")


@pytest.mark.usefixtures("no_keyring")
def test_without_a_keyring_the_error_says_how_to_get_one() -> None:
    store = SecretStore()
    with pytest.raises(SecretStoreError, match="LAMBDA_API_KEY"):
        store.set(SecretName.LAMBDA, KEY)
    with pytest.raises(SecretStoreError, match="Secret Service"):
        store.get(SecretName.LAMBDA)
    assert store.status(SecretName.LAMBDA).source is SecretSource.NO_KEYRING


@pytest.mark.usefixtures("no_keyring")
def test_without_a_keyring_environment_variables_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", KEY)
    assert SecretStore().get(SecretName.VAST) == KEY


def test_secrets_never_reach_the_log_file() -> None:
    SecretStore().set(SecretName.RUNPOD, KEY)
    log_file = configure_logging("DEBUG")
    log = get_logger("test")
    log.info("calling the API with key %s", KEY)
    try:
        raise RuntimeError(f"request failed for {KEY}")
    except RuntimeError:
        log.exception("boom")
    text = log_file.read_text()
    assert log_file == app_paths().log_dir / LOG_FILE_NAME
    assert "calling the API with key ***" in text
    assert "request failed for ***" in text
    assert KEY not in text
