"""API keys and tokens, kept in the OS keyring (never in settings, logs, run files or argv).

For headless use, the environment variables ``RUNPOD_API_KEY``, ``VAST_API_KEY``, ``LAMBDA_API_KEY`` and
``HF_TOKEN`` are read too, and take precedence over the keyring.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

import keyring
import keyring.errors

from desktop.services.platform.logs import get_logger, remember_secret

KEYRING_SERVICE = "rentune"

_log = get_logger("secrets")


class SecretName(StrEnum):
    """The secrets Rentune knows, each with its environment variable and a human label."""

    RUNPOD = "runpod"
    VAST = "vast"
    LAMBDA = "lambda"
    HUGGINGFACE = "huggingface"

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
}
_LABELS = {
    SecretName.RUNPOD: "RunPod API key",
    SecretName.VAST: "Vast.ai API key",
    SecretName.LAMBDA: "Lambda Cloud API key",
    SecretName.HUGGINGFACE: "Hugging Face token",
}

# The secrets a feature uses today, as the Settings page and ``rentune keys list`` offer them: the cloud API keys
# (read when renting) first, then the Hugging Face token.
SECRETS_IN_USE: tuple[SecretName, ...] = (
    SecretName.RUNPOD,
    SecretName.VAST,
    SecretName.LAMBDA,
    SecretName.HUGGINGFACE,
)


class SecretSource(StrEnum):
    """Where a secret's value comes from."""

    ENVIRONMENT = "environment"
    KEYRING = "keyring"
    MISSING = "missing"
    NO_KEYRING = "no-keyring"


class SecretStoreError(RuntimeError):
    """The keyring cannot be used; the message says how to get one."""


@dataclass(frozen=True)
class SecretStatus:
    """Whether a secret is set, and where from, without revealing it."""

    name: SecretName
    source: SecretSource


_NO_KEYRING_HINT = (
    "no system keyring is available. On Linux, install and unlock a Secret Service "
    "(e.g. gnome-keyring or KWallet); for headless use, set {env} in the environment instead"
)


class SecretStore:
    """Reads and writes Rentune's secrets in the OS keyring.

    Every value read is registered with the log redactor, so it can never reach a log file.
    """

    def get(self, name: SecretName) -> str | None:
        """Returns the secret's value, from the environment or the keyring, or ``None`` when it is not set.

        Raises:
            SecretStoreError: No keyring backend is available and the variable is not set either.
        """
        value = os.environ.get(name.env_var) or self._keyring_get(name)
        if value:
            remember_secret(value)
        return value or None

    def set(self, name: SecretName, value: str) -> None:
        """Stores a secret in the keyring.

        Raises:
            SecretStoreError: The value is empty, or no keyring backend is available.
        """
        value = value.strip()
        if not value:
            raise SecretStoreError(f"the {name.label} is empty; paste the key and try again")
        remember_secret(value)
        try:
            keyring.set_password(KEYRING_SERVICE, name.value, value)
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
        """Says whether the secret is set and where from, or that no keyring is usable."""
        if os.environ.get(name.env_var):
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
        return value if isinstance(value, str) else None

    @staticmethod
    def _unavailable(name: SecretName, exc: Exception) -> SecretStoreError:
        return SecretStoreError(f"Cannot use the keyring ({exc}): " + _NO_KEYRING_HINT.format(env=name.env_var))
