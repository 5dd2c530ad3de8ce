from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import keyring
import keyring.backends.fail
import keyring.backends.null
import keyring.errors
import pytest
from keyring.backend import KeyringBackend

from desktop.services.platform.logs import LOG_FILE_NAME, configure_logging, get_logger, redact_known
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import (
    SecretName,
    SecretSource,
    SecretStatus,
    SecretStore,
    SecretStoreError,
    StoreProbe,
    StoreState,
    environment_problems,
    probe_secret_store,
    without_secrets,
)
from tests.fixtures.memory_keyring import MemoryKeyring, using_keyring

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


# -- keys from the environment: stripped and checked like keyring keys ---------------------------------------------


def test_a_key_from_the_environment_is_stripped_and_registered_as_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", f"  {KEY}\n")
    store = SecretStore()
    assert store.get(SecretName.RUNPOD) == KEY
    assert store.status(SecretName.RUNPOD) == SecretStatus(SecretName.RUNPOD, SecretSource.ENVIRONMENT)
    assert redact_known(f"GET /pods failed for {KEY}") == "GET /pods failed for ***"


def test_a_blank_environment_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    store = SecretStore()
    store.set(SecretName.VAST, KEY)
    monkeypatch.setenv("VAST_API_KEY", " \t\n")
    assert store.get(SecretName.VAST) == KEY, "the keyring's key is used, not a blank variable"
    assert store.status(SecretName.VAST).source is SecretSource.KEYRING
    monkeypatch.setenv("LAMBDA_API_KEY", "   ")
    assert store.get(SecretName.LAMBDA) is None
    assert store.status(SecretName.LAMBDA).source is SecretSource.MISSING
    assert environment_problems() == []


@pytest.mark.parametrize(
    ("value", "words"),
    [("abc def123456", "space"), ("abc\ndef123456", "line break"), ("abc\x1bdef123456", "control character")],
)
def test_a_malformed_environment_key_names_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, value: str, words: str
) -> None:
    monkeypatch.setenv("HF_TOKEN", value)
    store = SecretStore()
    with pytest.raises(SecretStoreError) as raised:
        store.get(SecretName.HUGGINGFACE)
    message = str(raised.value)
    assert message.startswith("HF_TOKEN holds a Hugging Face token with a " + words)
    assert "set it to the key alone" in message and "unset HF_TOKEN" in message
    assert "\n" not in message and value not in message, "one line, and the value itself is not repeated"
    status = store.status(SecretName.HUGGINGFACE)
    assert status.source is SecretSource.ENVIRONMENT and status.problem == message and not status.usable
    assert environment_problems() == [message]


def test_a_key_typed_in_with_a_space_inside_is_refused_like_one_from_the_environment(
    memory_keyring: MemoryKeyring,
) -> None:
    with pytest.raises(SecretStoreError, match="has a space inside; copy the key alone"):
        SecretStore().set(SecretName.RUNPOD, "rk_live_abc def")
    with pytest.raises(SecretStoreError, match="control character"):
        SecretStore().set(SecretName.RUNPOD, "rk_live_\u200babcdef")  # a zero-width space pasted from a web page
    assert memory_keyring.passwords == {}


# -- one redaction for every message ---------------------------------------------------------------------------------


def test_redaction_masks_secret_variables_never_read_and_keeps_the_patterns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "vast-key-" + "0123456789abcdef")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-" + "fedcba9876543210")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "svc-" + "ab12cd34ef56")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-" + "zz99yy88xx77")
    SecretStore().set(SecretName.LAMBDA, KEY)
    text = (
        "vast-key-0123456789abcdef wandb-fedcba9876543210 svc-ab12cd34ef56 aws-zz99yy88xx77 "
        f"{KEY} hf_{'a1B2c3D4e5F6g7H8i9J0kLmN'} keep-this-word"
    )
    assert redact_known(text) == "*** *** *** *** *** *** keep-this-word"


def test_the_log_masks_a_key_from_the_environment_that_no_code_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    log_file = configure_logging("DEBUG")
    get_logger("test").error("the provider answered 401 for %s", KEY)
    text = log_file.read_text()
    assert "answered 401 for ***" in text and KEY not in text


# -- child processes get no secret -----------------------------------------------------------------------------------


def test_child_environments_lose_every_secret_variable() -> None:
    env = {
        "RUNPOD_API_KEY": "a",
        "VAST_API_KEY": "b",
        "LAMBDA_API_KEY": "c",
        "HF_TOKEN": "d",
        "GITHUB_TOKEN": "e",
        "openai_api_key": "f",
        "AWS_SECRET_ACCESS_KEY": "g",
        "PATH": "/usr/bin",
        "HOME": "/home/me",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    assert without_secrets(env) == {
        "PATH": "/usr/bin",
        "HOME": "/home/me",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    assert all(name.env_var not in without_secrets({name.env_var: "x"}) for name in SecretName)


def test_without_arguments_the_child_environment_is_this_process_less_its_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    monkeypatch.setenv("RENTUNE_SOMETHING", "kept")
    env = without_secrets()
    assert "HF_TOKEN" not in env and env["RENTUNE_SOMETHING"] == "kept" and env["PATH"] == os.environ["PATH"]


# -- does the keyring keep secrets? ----------------------------------------------------------------------------------


class ForgetfulKeyring(KeyringBackend):
    """A keyring that accepts every secret and gives back another (a broken third-party backend)."""

    priority = 1  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        return "something else"

    def set_password(self, service: str, username: str, password: str) -> None:
        return None

    def delete_password(self, service: str, username: str) -> None:
        return None


class LockedKeyring(KeyringBackend):
    """A keyring that refuses to be used (locked, access denied)."""

    priority = 1  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        raise keyring.errors.KeyringLocked("the collection is locked")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.KeyringLocked("the collection is locked")

    def delete_password(self, service: str, username: str) -> None:
        raise keyring.errors.KeyringLocked("the collection is locked")


def test_a_working_keyring_passes_the_probe_and_keeps_nothing_of_it(memory_keyring: MemoryKeyring) -> None:
    probe = probe_secret_store()
    assert probe == StoreProbe(StoreState.WORKS, "tests.fixtures.memory_keyring.MemoryKeyring")
    assert probe.ok and not probe.blocks_renting and probe.problem == ""
    assert memory_keyring.passwords == {}, "the throwaway secret is deleted"


def test_the_null_keyring_stores_nothing_and_blocks_renting() -> None:
    with using_keyring(keyring.backends.null.Keyring()):
        probe = probe_secret_store()
    assert probe.state is StoreState.DROPS and probe.blocks_renting and not probe.ok
    assert probe.problem.startswith(
        "the keyring backend keyring.backends.null.Keyring stores nothing: unset PYTHON_KEYRING_BACKEND"
    )
    assert "gnome-keyring or KWallet" in probe.problem and "\n" not in probe.problem


def test_a_keyring_that_gives_back_another_value_drops_secrets() -> None:
    with using_keyring(ForgetfulKeyring()):
        probe = probe_secret_store()
    assert probe.state is StoreState.DROPS and probe.blocks_renting
    assert "ForgetfulKeyring did not give back a test secret" in probe.problem


def test_a_keyring_that_refuses_blocks_renting_and_says_to_unlock_it() -> None:
    with using_keyring(LockedKeyring()):
        probe = probe_secret_store()
    assert probe.state is StoreState.FAILS and probe.blocks_renting
    assert "refused a test secret (KeyringLocked: the collection is locked): unlock the keyring" in probe.problem


@pytest.mark.usefixtures("no_keyring")
def test_no_keyring_at_all_keeps_run_keys_in_files_and_does_not_block_renting(rentune_home: Path) -> None:
    probe = probe_secret_store()
    assert probe.state is StoreState.NO_KEYRING and not probe.ok and not probe.blocks_renting
    assert probe.backend == "keyring.backends.fail.Keyring"
    assert str(app_paths().data_dir / "run-keys") in probe.problem and "RUNPOD_API_KEY" in probe.problem
