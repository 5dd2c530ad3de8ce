"""Adding a provider's API key from the app: checked with the provider first, then kept in the keyring.

What a page shows about a key is :class:`KeyState` (where it comes from, and its last characters only); what went
wrong is :class:`KeyEntryError`, whose message is a sentence for people (no command lines, no raw exceptions).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from desktop.services.platform.secrets import SecretSource, SecretStore, SecretStoreError
from desktop.services.providers.base import AuthError, ProviderError, ProviderName
from desktop.services.providers.registry import PROVIDERS, check_api_key
from desktop.services.providers.words import plain_reason

#: Characters of a key shown after the mask.
SHOWN_CHARACTERS = 4


class KeyEntryError(ValueError):
    """A key could not be checked or kept; the message is a sentence saying why and what to do."""


@dataclass(frozen=True)
class KeyState:
    """Whether a provider has a key, where it comes from, and how it is shown.

    Attributes:
        provider: The provider.
        source: The keyring, the environment, missing, or no keyring on this computer.
        masked: The key with all but its last characters hidden ("" when there is none).
        problem: Why the key cannot be used (a space inside its environment variable), "" when it can.
    """

    provider: ProviderName
    source: SecretSource
    masked: str = ""
    problem: str = ""

    @property
    def present(self) -> bool:
        """Whether a usable key is set."""
        return self.source in {SecretSource.KEYRING, SecretSource.ENVIRONMENT} and not self.problem

    @property
    def words(self) -> str:
        """Where the key comes from, for the page: ``Key ••••1a2b, in the keyring``."""
        if self.problem:
            return f"{self.problem[0].upper()}{self.problem[1:]}."
        if self.source is SecretSource.ENVIRONMENT:
            return f"Key {self.masked}, from {PROVIDERS[self.provider].secret.env_var}"
        if self.source is SecretSource.KEYRING:
            return f"Key {self.masked}, in the keyring"
        return "No key yet"


def masked(key: str) -> str:
    """``••••1a2b``: the last characters of a long key, nothing of a short one."""
    key = key.strip()
    return "••••" + (key[-SHOWN_CHARACTERS:] if len(key) >= 3 * SHOWN_CHARACTERS else "")


def key_state(name: ProviderName, secrets: SecretStore) -> KeyState:
    """The provider's key as the page shows it (blocking: the keyring may take a while or prompt)."""
    secret = PROVIDERS[name].secret
    status = secrets.status(secret)
    if status.problem:
        return KeyState(name, status.source, problem=status.problem)
    if status.source not in {SecretSource.KEYRING, SecretSource.ENVIRONMENT}:
        return KeyState(name, status.source)
    try:
        value = secrets.get(secret) or ""
    except SecretStoreError:
        return KeyState(name, SecretSource.NO_KEYRING)
    return KeyState(name, status.source, masked(value))


async def add_key(name: ProviderName, key: str, secrets: SecretStore) -> KeyState:
    """Checks ``key`` with the provider, then stores it in the keyring.

    Raises:
        KeyEntryError: The key is empty, the provider refused it or could not be asked, or there is no keyring.
    """
    key = key.strip()
    label = name.label
    if not key:
        raise KeyEntryError(f"Paste your {label} API key first.")
    try:
        await check_api_key(name, key)
    except AuthError as exc:
        raise KeyEntryError(refused_words(name)) from exc
    except ProviderError as exc:
        raise KeyEntryError(
            f"{label} could not check the key: {plain_reason(exc)}. Check the internet connection and try again."
        ) from exc
    try:
        await asyncio.to_thread(secrets.set, PROVIDERS[name].secret, key)
    except SecretStoreError as exc:
        raise KeyEntryError(no_keyring_words(name, checked=True)) from exc
    return await asyncio.to_thread(key_state, name, secrets)


def refused_words(name: ProviderName) -> str:
    """Why a key was refused and where a good one is."""
    return (
        f"{name.label} refused this key. Check that you copied all of it from {PROVIDERS[name].console}; a key "
        "that was revoked or belongs to another account is refused too."
    )


def no_keyring_words(name: ProviderName, *, checked: bool = False) -> str:
    """What to do on a computer without a keyring."""
    start = f"{name.label} accepted the key, but this computer" if checked else "This computer"
    return (
        f"{start} has no keyring to keep it in. Install and unlock one (such as GNOME Keyring or KWallet), or set "
        f"{PROVIDERS[name].secret.env_var} in the environment before starting Rentune."
    )
