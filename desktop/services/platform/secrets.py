"""API keys and tokens, kept in the OS keyring (never in settings, logs, run files or argv).

For headless use, the environment variables ``RUNPOD_API_KEY``, ``VAST_API_KEY``, ``LAMBDA_API_KEY``, ``HF_TOKEN``,
``WANDB_API_KEY``, ``RENTUNE_BUCKET_KEY_ID`` and ``RENTUNE_BUCKET_SECRET`` are read too, and take precedence over the
keyring. A value from either place is stripped and checked the same way (see :func:`clean_secret`), and registered
with the log redactor.

:func:`probe_secret_store` says whether the keyring really keeps what it is given; :func:`without_secrets` is the
environment for child processes that need no secret.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import keyring
import keyring.backend
import keyring.backends.fail
import keyring.backends.null
import keyring.errors

from desktop.core.redaction import is_secret_variable
from desktop.services.platform.logs import get_logger, remember_secret
from desktop.services.platform.paths import app_paths

KEYRING_SERVICE = "rentune"

_log = get_logger("secrets")


class SecretName(StrEnum):
    """The secrets Rentune knows, each with its environment variable and a human label."""

    RUNPOD = "runpod"
    VAST = "vast"
    LAMBDA = "lambda"
    HUGGINGFACE = "huggingface"
    WANDB = "wandb"
    BUCKET_KEY_ID = "bucket-key-id"
    BUCKET_SECRET = "bucket-secret"  # noqa: S105 - the keyring entry's name, not a secret

    @property
    def env_var(self) -> str:
        """The environment variable accepted for headless use."""
        return _ENV_VARS[self]

    @property
    def label(self) -> str:
        """What the secret is, as shown to a user."""
        return _LABELS[self]


_ENV_VARS = {
    SecretName.RUNPOD: "RUNPOD_API_KEY",
    SecretName.VAST: "VAST_API_KEY",
    SecretName.LAMBDA: "LAMBDA_API_KEY",
    SecretName.HUGGINGFACE: "HF_TOKEN",
    SecretName.WANDB: "WANDB_API_KEY",
    SecretName.BUCKET_KEY_ID: "RENTUNE_BUCKET_KEY_ID",
    SecretName.BUCKET_SECRET: "RENTUNE_BUCKET_SECRET",
}
_LABELS = {
    SecretName.RUNPOD: "RunPod API key",
    SecretName.VAST: "Vast.ai API key",
    SecretName.LAMBDA: "Lambda Cloud API key",
    SecretName.HUGGINGFACE: "Hugging Face token",
    SecretName.WANDB: "Weights & Biases API key",
    SecretName.BUCKET_KEY_ID: "Bucket access key ID",
    SecretName.BUCKET_SECRET: "Bucket secret key",
}

# The secrets a feature uses today, as the Settings page and ``rentune keys list`` offer them: the cloud API keys
# (read when renting) first, then the Hugging Face token, the W&B key (sent to a run reporting to W&B) and the
# bucket's keys (Storage in Settings; they never leave this computer).
SECRETS_IN_USE: tuple[SecretName, ...] = (
    SecretName.RUNPOD,
    SecretName.VAST,
    SecretName.LAMBDA,
    SecretName.HUGGINGFACE,
    SecretName.WANDB,
    SecretName.BUCKET_KEY_ID,
    SecretName.BUCKET_SECRET,
)


class SecretSource(StrEnum):
    """Where a secret's value comes from."""

    ENVIRONMENT = "environment"
    KEYRING = "keyring"
    MISSING = "missing"
    NO_KEYRING = "no-keyring"


class SecretStoreError(RuntimeError):
    """The keyring cannot be used; the message says how to get one."""


class MalformedSecretError(SecretStoreError):
    """A secret's value (typed, or from its environment variable) has a space or control character inside.

    The message names where the value came from and the fix.
    """


@dataclass(frozen=True)
class SecretStatus:
    """Whether a secret is set, and where from, without revealing it.

    Attributes:
        name: The secret.
        source: Where its value comes from.
        problem: Why the value cannot be used (a space inside an environment variable), "" when it can.
    """

    name: SecretName
    source: SecretSource
    problem: str = ""

    @property
    def usable(self) -> bool:
        """Whether a good value is set (in the keyring or the environment)."""
        return self.source in {SecretSource.KEYRING, SecretSource.ENVIRONMENT} and not self.problem


def _bad_character(value: str) -> str | None:
    """The first whitespace or control (or invisible format) character in ``value``, or None."""
    for character in value:
        if character.isspace() or unicodedata.category(character) in {"Cc", "Cf", "Cs", "Co", "Cn"}:
            return character
    return None


def clean_secret(value: str | None, name: SecretName, *, variable: bool = False) -> str | None:
    """A secret's value as it may be used: stripped, ``None`` when empty, refused with a space or control inside.

    The same check applies to a key typed in for the keyring and to one from the environment.

    Args:
        value: The value as given (``None`` when not set).
        name: The secret, for the message.
        variable: The value came from the secret's environment variable (the message names it).

    Raises:
        MalformedSecretError: A whitespace or control character is inside the value; the message names where it
            came from and the fix.
    """
    stripped = (value or "").strip()
    bad = _bad_character(stripped)
    if bad is None:
        return stripped or None
    if variable:
        raise MalformedSecretError(
            f"{name.env_var} holds a {name.label} with a {_character_words(bad)} inside; set it to the key alone "
            f"(no spaces, quotes or line breaks), or unset {name.env_var} to use the keyring"
        )
    raise MalformedSecretError(
        f"the {name.label} has a {_character_words(bad)} inside; copy the key alone (no spaces or line breaks) "
        "and try again"
    )


def _character_words(character: str) -> str:
    if character in "\r\n":
        return "line break"
    if character == " ":
        return "space"
    kind = "whitespace" if character.isspace() else "control"
    return f"{kind} character (U+{ord(character):04X})"


_NO_KEYRING_HINT = (
    "no system keyring is available. On Linux, install and unlock a Secret Service "
    "(e.g. gnome-keyring or KWallet); for headless use, set {env} in the environment instead"
)


def read_environment(name: SecretName) -> str | None:
    """The secret's value from its environment variable, stripped and checked (``None`` when unset or blank).

    Raises:
        SecretStoreError: The variable holds a space or control character inside; the message names it and the fix.
    """
    value = clean_secret(os.environ.get(name.env_var), name, variable=True)
    if value:
        remember_secret(value)
    return value


def environment_problems() -> list[str]:
    """One line per secret environment variable that is set but cannot be used, naming it and the fix."""
    problems = []
    for name in SecretName:
        try:
            read_environment(name)
        except SecretStoreError as exc:
            problems.append(str(exc))
    return problems


class SecretStore:
    """Reads and writes Rentune's secrets in the OS keyring.

    Every value read is registered with the log redactor, so it can never reach a log file.
    """

    def get(self, name: SecretName) -> str | None:
        """Returns the secret's value, from the environment or the keyring, or ``None`` when it is not set.

        Raises:
            SecretStoreError: The environment variable holds a malformed value, or no keyring backend is available
                and the variable is not set either.
        """
        return read_environment(name) or self._keyring_get(name)

    def set(self, name: SecretName, value: str) -> None:
        """Stores a secret in the keyring, stripped.

        Raises:
            SecretStoreError: The value is empty or has a space or control character inside, or no keyring backend
                is available.
        """
        cleaned = clean_secret(value, name)
        if cleaned is None:
            raise SecretStoreError(f"the {name.label} is empty; paste the key and try again")
        remember_secret(cleaned)
        try:
            keyring.set_password(KEYRING_SERVICE, name.value, cleaned)
        except keyring.errors.KeyringError as exc:
            raise self._unavailable(name, exc) from exc
        _log.info("stored %s in the keyring", name.label)

    def delete(self, name: SecretName) -> None:
        """Removes a secret from the keyring; removing one that is not there is not an error."""
        try:
            keyring.delete_password(KEYRING_SERVICE, name.value)
        except keyring.errors.PasswordDeleteError:
            return
        except keyring.errors.KeyringError as exc:
            raise self._unavailable(name, exc) from exc
        _log.info("removed %s from the keyring", name.label)

    def status(self, name: SecretName) -> SecretStatus:
        """Says whether the secret is set and where from (with the problem of a malformed variable), or no keyring."""
        try:
            from_environment = read_environment(name)
        except SecretStoreError as exc:
            return SecretStatus(name, SecretSource.ENVIRONMENT, str(exc))
        if from_environment:
            return SecretStatus(name, SecretSource.ENVIRONMENT)
        try:
            found = self._keyring_get(name)
        except SecretStoreError:
            return SecretStatus(name, SecretSource.NO_KEYRING)
        return SecretStatus(name, SecretSource.KEYRING if found else SecretSource.MISSING)

    def _keyring_get(self, name: SecretName) -> str | None:
        try:
            value = keyring.get_password(KEYRING_SERVICE, name.value)
        except keyring.errors.KeyringError as exc:
            raise self._unavailable(name, exc) from exc
        value = value.strip() if isinstance(value, str) else ""
        if value:
            remember_secret(value)
        return value or None

    @staticmethod
    def _unavailable(name: SecretName, exc: Exception) -> SecretStoreError:
        return SecretStoreError(f"Cannot use the keyring ({exc}): " + _NO_KEYRING_HINT.format(env=name.env_var))


# -- child processes -------------------------------------------------------------------------------------------------


def without_secrets(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that needs no secret: ``env`` (this process's by default), secrets removed.

    Every variable whose name says it is secret goes: Rentune's own (``RUNPOD_API_KEY``, ``VAST_API_KEY``,
    ``LAMBDA_API_KEY``, ``HF_TOKEN``, the bucket's) and any other ``*_API_KEY``, ``*_TOKEN``, ``*_KEY_ID`` or
    ``*SECRET*``. pip, the converters and llama.cpp's tools start with this, so a key can never show up in their
    output or their crash reports.
    """
    source = os.environ if env is None else env
    return {name: value for name, value in source.items() if not is_secret_variable(name)}


# -- does the keyring keep secrets? ----------------------------------------------------------------------------------

#: The folder (under the data folder) holding run keys where no keyring exists at all.
KEY_FILE_FOLDER = "run-keys"
_KEYRINGS = "a keyring such as gnome-keyring or KWallet"


class StoreState(StrEnum):
    """What the keyring did with a throwaway secret."""

    WORKS = "works"  # kept it and gave it back
    NO_KEYRING = "no-keyring"  # none exists here (a headless server): run keys go to private files instead
    DROPS = "drops"  # took it and lost it (the null backend, or a read-back that differs): renting is blocked
    FAILS = "fails"  # refused it (locked, access denied): renting is blocked


@dataclass(frozen=True)
class StoreProbe:
    """The keyring's answer to :func:`probe_secret_store`.

    Attributes:
        state: What happened to the throwaway secret.
        backend: The keyring backend, ``module.Class``.
        finding: What is wrong, "" when it works.
        fix: What to do about it, "" when it works.
    """

    state: StoreState
    backend: str
    finding: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        """Whether the keyring keeps secrets."""
        return self.state is StoreState.WORKS

    @property
    def blocks_renting(self) -> bool:
        """Whether a rented run's SSH key would be lost (renting is refused then)."""
        return self.state in {StoreState.DROPS, StoreState.FAILS}

    @property
    def problem(self) -> str:
        """The finding and its fix in one line ("" when it works)."""
        return f"{self.finding}: {self.fix}" if self.finding else ""


def backend_name(backend: keyring.backend.KeyringBackend | None = None) -> str:
    """The keyring backend (the one in use by default) as ``module.Class``, e.g. ``keyring.backends.null.Keyring``."""
    kind = type(backend or keyring.get_keyring())
    return f"{kind.__module__}.{kind.__name__}"


def keyring_missing() -> bool:
    """Whether no keyring exists here at all (keyring's fail backend: a headless server, or no Secret Service)."""
    return isinstance(keyring.get_keyring(), keyring.backends.fail.Keyring)


def key_file_folder() -> Path:
    """Where run keys are kept, one file each, when no keyring exists (the folder is the user's only)."""
    return app_paths().data_dir / KEY_FILE_FOLDER


def probe_secret_store() -> StoreProbe:
    """Writes a throwaway secret to the keyring, reads it back and deletes it: whether the keyring keeps secrets.

    Blocking (a keyring may take a moment or ask to be unlocked): call it off the UI thread.
    """
    backend = keyring.get_keyring()
    name = backend_name(backend)
    if isinstance(backend, keyring.backends.fail.Keyring):
        return StoreProbe(
            StoreState.NO_KEYRING,
            name,
            f"no keyring is available ({name})",
            f"run keys are kept in files only you can read in {key_file_folder()}, and API keys must come from "
            f"RUNPOD_API_KEY, VAST_API_KEY, LAMBDA_API_KEY or HF_TOKEN; to keep them in a keyring, install {_KEYRINGS}",
        )
    if isinstance(backend, keyring.backends.null.Keyring):
        return _drops(name, "stores nothing")
    return _write_read_delete(backend, name)


def _write_read_delete(backend: keyring.backend.KeyringBackend, name: str) -> StoreProbe:
    user, value = f"probe/{secrets.token_hex(4)}", secrets.token_urlsafe(24)
    try:
        backend.set_password(KEYRING_SERVICE, user, value)
        read = backend.get_password(KEYRING_SERVICE, user)
    except Exception as exc:  # noqa: BLE001 - a third-party backend may raise anything; the answer is the failure
        return StoreProbe(
            StoreState.FAILS,
            name,
            f"the keyring backend {name} refused a test secret ({type(exc).__name__}: {' '.join(str(exc).split())})",
            "unlock the keyring (or let Rentune use it) and check again, or install " + _KEYRINGS,
        )
    finally:
        with contextlib.suppress(Exception):
            backend.delete_password(KEYRING_SERVICE, user)
    if read != value:
        return _drops(name, "did not give back a test secret it was given")
    return StoreProbe(StoreState.WORKS, name)


def _drops(name: str, what: str) -> StoreProbe:
    return StoreProbe(
        StoreState.DROPS,
        name,
        f"the keyring backend {name} {what}",
        f"unset PYTHON_KEYRING_BACKEND (or fix keyringrc.cfg) or install {_KEYRINGS}, then start Rentune again",
    )
