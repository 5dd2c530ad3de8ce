"""Adding a provider's API key from the app: checked with the provider first, then kept in the keyring.

What a page shows about a key is :class:`KeyState` (where it comes from, and its last characters only); what went
wrong is :class:`KeyEntryError`, whose message is a sentence for people (no command lines, no raw exceptions).
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from http import HTTPStatus

from desktop.services.platform.secrets import SecretSource, SecretStore, SecretStoreError
from desktop.services.providers.base import (
    AuthError,
    ProviderError,
    ProviderName,
    RateLimitedError,
    UncertainOutcomeError,
)
from desktop.services.providers.registry import PROVIDERS, check_api_key
from desktop.services.providers.words import plain_reason

#: Characters of a key shown after the mask.
SHOWN_CHARACTERS = 4
#: Words of a provider's answer that quote a request ("no route GET /api/v0/users/current/"): not for people.
_REQUEST_WORDS = re.compile(r"(?:^|\s)/\S|\b(?:GET|POST|PUT|PATCH|DELETE)\b|\bno route\b", re.IGNORECASE)


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
        raise KeyEntryError(check_failed_words(name, exc)) from exc
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


def check_failed_words(name: ProviderName, exc: ProviderError) -> str:
    """Why ``name`` could not check a key (other than refusing it) and what to do, without quoting the request."""
    label = name.label
    if isinstance(exc, RateLimitedError):
        return f"{label} is turning requests away for a moment (too many in a short time). Try again in a minute."
    if isinstance(exc, UncertainOutcomeError):
        return f"{label} did not answer the check (its service failed or took too long). Try again in a few minutes."
    info = PROVIDERS[name]
    override = os.environ.get(info.url_env)
    address = f"the address in {info.url_env} ({override})" if override else ""
    if exc.status is None:
        where = f", and {address}," if override else ""
        return f"Rentune could not reach {label} to check the key. Check the internet connection{where} and try again."
    if exc.status != HTTPStatus.NOT_FOUND and exc.status >= HTTPStatus.BAD_REQUEST:
        quoted = f"\u201c{_reason(exc)}\u201d"
        return f"{label} could not check the key: {quoted}. See your account at {info.console}, then try again."
    return _unread_answer_words(label, exc.status, address)


def _unread_answer_words(label: str, status: int, address: str) -> str:
    """A key check answered "not found" (or not in the API's form): the address is wrong, or the API changed."""
    what = (
        f"{label} did not recognise Rentune's request to check the key (it answered \u201cnot found\u201d)"
        if status == HTTPStatus.NOT_FOUND
        else f"{label} answered the check of the key with something Rentune cannot read"
    )
    fix = (
        f"{address[0].upper()}{address[1:]} may not be {label}'s API: correct it, or remove it to use {label}'s own, "
        "then start Rentune again."
        if address
        else f"Try again later; if it goes on, {label} may have changed its API and Rentune needs an update."
    )
    return f"{what}. {fix}"


def _reason(exc: ProviderError) -> str:
    """The provider's own words, or its status in words where they quote the request."""
    reason = plain_reason(exc)
    if not _REQUEST_WORDS.search(reason):
        return reason
    try:
        return HTTPStatus(exc.status or 0).phrase.lower()
    except ValueError:
        return "no reason given"


def no_keyring_words(name: ProviderName, *, checked: bool = False) -> str:
    """What to do on a computer without a keyring."""
    start = f"{name.label} accepted the key, but this computer" if checked else "This computer"
    return (
        f"{start} has no keyring to keep it in. Install and unlock one (such as GNOME Keyring or KWallet), or set "
        f"{PROVIDERS[name].secret.env_var} in the environment before starting Rentune."
    )
