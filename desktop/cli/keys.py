"""``rentune keys set|list|delete``: cloud API keys in the keyring, each checked with its provider before storing.

A key is read at a hidden prompt (or from stdin when piped), never from argv, and is never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.services.platform.logs import remember_secret
from desktop.services.platform.secrets import (
    SECRETS_IN_USE,
    SecretName,
    SecretSource,
    SecretStatus,
    SecretStore,
    SecretStoreError,
)
from desktop.services.providers.base import AuthError, ProviderError, ProviderName
from desktop.services.providers.registry import PROVIDERS, check_api_key

#: Checks a key with its provider; raises AuthError when refused, ProviderError when the provider cannot answer.
KeyCheck = Callable[[ProviderName, str], Coroutine[Any, Any, None]]


def read_key(label: str) -> str:
    """The key typed at a hidden prompt (on a terminal) or the first line of stdin (piped), stripped."""
    if sys.stdin.isatty():
        return getpass.getpass(f"{label}: ").strip()
    return sys.stdin.readline().strip()


#: The secrets ``rentune keys set`` stores without asking their service first, with when they are checked instead.
UNCHECKED_SECRETS = {
    SecretName.HUGGINGFACE.value: "the Hub checks it when a run or a download uses it",
    SecretName.WANDB.value: "W&B checks it when a run reporting to W&B starts",
    SecretName.BUCKET_KEY_ID.value: "rentune storage check tries it",
    SecretName.BUCKET_SECRET.value: "rentune storage check tries it",
}


def _where(status: SecretStatus) -> str:
    """Where a secret comes from, with the fix when it is missing (never the value)."""
    name = status.name
    fix = (
        f"rentune keys set {name.value}, save it on the Settings page or set {name.env_var}"
        if name.value in UNCHECKED_SECRETS
        else f"rentune keys set {name.value}"
    )
    return {
        SecretSource.KEYRING: "keyring",
        SecretSource.ENVIRONMENT: f"environment {name.env_var}",
        SecretSource.MISSING: f"missing: {fix}",
        SecretSource.NO_KEYRING: f"no keyring: set {name.env_var} in the environment",
    }[status.source]


class KeysCommands:
    """Implements ``rentune keys``.

    Args:
        check: How a key is checked before it is stored (the provider's API by default).
        secrets: The secret store (the OS keyring by default).
    """

    def __init__(self, check: KeyCheck | None = None, secrets: SecretStore | None = None) -> None:
        self.check = check or check_api_key
        self.secrets = secrets or SecretStore()

    def set(self, name: ProviderName) -> int:
        """Reads a key, checks it with the provider and stores it in the keyring; nothing is stored when refused."""
        info = PROVIDERS[name]
        key = read_key(info.secret.label)
        if not key:
            raise CliError(
                f"no {info.secret.label} given; paste it at the prompt or pipe it in "
                f"(rentune keys set {name.value} < key.txt); get one at {info.console}"
            )
        remember_secret(key)
        self._check(name, key)
        try:
            self.secrets.set(info.secret, key)
        except SecretStoreError as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        print(f"stored the {info.secret.label} in the keyring (checked with {name.label})")
        if os.environ.get(info.secret.env_var):
            print(f"note: {info.secret.env_var} in the environment is used instead until you unset it")
        return EXIT_OK

    def _check(self, name: ProviderName, key: str) -> None:
        info = PROVIDERS[name]
        try:
            asyncio.run(self.check(name, key))
        except AuthError as exc:
            raise CliError(
                f"{name.label} refused this {info.secret.label} ({exc.reason}); nothing was stored; "
                f"copy the key again from {info.console}",
                EXIT_FAILED,
            ) from exc
        except ProviderError as exc:
            raise CliError(
                f"cannot check the {info.secret.label}: {name.label} did not answer ({exc.message}); nothing was "
                f"stored; run rentune keys set {name.value} again once {name.label} is reachable",
                EXIT_FAILED,
            ) from exc

    def list(self, as_json: bool) -> int:
        """Prints where each key comes from: keyring, environment, missing or no keyring (never the key)."""
        statuses = [self.secrets.status(name) for name in SECRETS_IN_USE]
        if as_json:
            rows = [
                {"name": s.name.value, "label": s.name.label, "source": s.source.value, "env_var": s.name.env_var}
                for s in statuses
            ]
            print(json.dumps(rows, indent=2))
        else:
            width = max(len(s.name.label) for s in statuses)
            for status in statuses:
                print(f"{status.name.label:<{width}}  {_where(status)}")
        return EXIT_OK

    def set_unchecked(self, secret: SecretName) -> int:
        """Reads a token that is not a cloud's (Hugging Face, W&B) and stores it as it is: its service checks it."""
        key = read_key(secret.label)
        if not key:
            raise CliError(f"no {secret.label} given; paste it at the prompt or pipe it in (rentune keys set "
                           f"{secret.value} < key.txt)")  # fmt: skip
        remember_secret(key)
        try:
            self.secrets.set(secret, key)
        except SecretStoreError as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        print(f"stored the {secret.label} in the keyring ({UNCHECKED_SECRETS[secret.value]})")
        if os.environ.get(secret.env_var):
            print(f"note: {secret.env_var} in the environment is used instead until you unset it")
        return EXIT_OK

    def delete(self, name: ProviderName) -> int:
        """Removes a provider's key from the keyring, saying when the environment still provides one."""
        return self.delete_secret(PROVIDERS[name].secret)

    def delete_secret(self, secret: SecretName) -> int:
        """Removes a key or token from the keyring, saying when the environment still provides one."""
        before = self.secrets.status(secret).source
        try:
            self.secrets.delete(secret)
        except SecretStoreError as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        if before is SecretSource.MISSING:
            print(f"no {secret.label} was in the keyring; nothing to remove")
        elif before is SecretSource.ENVIRONMENT:
            print(f"removed any {secret.label} from the keyring")
            print(f"note: {secret.env_var} in the environment still provides one; unset it to stop using it")
        else:
            print(f"removed the {secret.label} from the keyring")
        return EXIT_OK


def run_keys(args: argparse.Namespace, commands: KeysCommands | None = None) -> int:
    """``rentune keys set|list|delete``: manages the API keys and tokens in the keyring."""
    commands = commands or KeysCommands()
    if args.keys_command == "list":
        return commands.list(args.json)
    if args.provider in UNCHECKED_SECRETS:
        secret = SecretName(args.provider)
        return commands.set_unchecked(secret) if args.keys_command == "set" else commands.delete_secret(secret)
    name = ProviderName(args.provider)
    return commands.set(name) if args.keys_command == "set" else commands.delete(name)
