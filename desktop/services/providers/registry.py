"""Which providers exist, where their APIs are, and how to open a client with the user's key.

Base URLs can be overridden by environment (``RENTUNE_RUNPOD_URL``, ``RENTUNE_VAST_URL``, ``RENTUNE_LAMBDA_URL``);
keys come from the keyring, else ``RUNPOD_API_KEY``, ``VAST_API_KEY``, ``LAMBDA_API_KEY``.

RunPod has a second URL: its GraphQL API, used only for spot (REST v2 has no spot), overridden by
``RENTUNE_RUNPOD_GRAPHQL_URL``; when only ``RENTUNE_RUNPOD_URL`` is overridden, GraphQL is looked for beside it
(``<that URL without /v2>/graphql``), so a REST URL pointed at a proxy or a fake never sends spot queries elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.providers.base import MissingKeyError, Provider, ProviderName

if TYPE_CHECKING:  # httpx loads in ~0.3 s: only the client modules, opened when used, import it
    import httpx

    from desktop.services.providers.http import RetryPolicy


@dataclass(frozen=True)
class ProviderInfo:
    """Where one provider lives and how it is set up.

    Attributes:
        name: The provider.
        url_env: The variable that overrides the API's URL.
        default_url: The API's URL.
        secret: Its API key's name in the keyring.
        module: The client module (imported only when used).
        class_name: The client class in that module.
        default_user: The SSH login user of its usual images.
        default_image: A PyTorch image that starts sshd and has Python 3 (None where machines are VMs).
        console: Where a user finds the key.
        graphql_url_env: The variable that overrides a second, GraphQL URL (RunPod's, for spot only; None elsewhere).
        default_graphql_url: That GraphQL URL.
    """

    name: ProviderName
    url_env: str
    default_url: str
    secret: SecretName
    module: str
    class_name: str
    default_user: str
    default_image: str | None
    console: str
    graphql_url_env: str | None = None
    default_graphql_url: str | None = None

    @property
    def url(self) -> str:
        """The API's URL now (the environment's override, else the default)."""
        return os.environ.get(self.url_env) or self.default_url

    @property
    def graphql_url(self) -> str | None:
        """The GraphQL URL now (None where the provider has none).

        Its own override, else beside an overridden API URL, else the default.
        """
        if self.graphql_url_env is None:
            return None
        rest = os.environ.get(self.url_env)
        beside = f"{rest.rstrip('/').removesuffix('/v2')}/graphql" if rest else None
        return os.environ.get(self.graphql_url_env) or beside or self.default_graphql_url


PROVIDERS: dict[ProviderName, ProviderInfo] = {
    ProviderName.RUNPOD: ProviderInfo(
        ProviderName.RUNPOD,
        "RENTUNE_RUNPOD_URL",
        "https://api.runpod.io/v2",
        SecretName.RUNPOD,
        "desktop.services.providers.runpod",
        "RunPodProvider",
        "root",
        "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
        "https://www.runpod.io/console/user/settings",
        graphql_url_env="RENTUNE_RUNPOD_GRAPHQL_URL",
        default_graphql_url="https://api.runpod.io/graphql",
    ),
    ProviderName.VAST: ProviderInfo(
        ProviderName.VAST,
        "RENTUNE_VAST_URL",
        "https://console.vast.ai/api/v0",
        SecretName.VAST,
        "desktop.services.providers.vast",
        "VastProvider",
        "root",
        "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-devel",
        "https://cloud.vast.ai/account/",
    ),
    ProviderName.LAMBDA: ProviderInfo(
        ProviderName.LAMBDA,
        "RENTUNE_LAMBDA_URL",
        "https://cloud.lambda.ai/api/v1",
        SecretName.LAMBDA,
        "desktop.services.providers.lambda_cloud",
        "LambdaProvider",
        "ubuntu",
        None,
        "https://cloud.lambda.ai/api-keys",
    ),
}


def provider_name(text: str) -> ProviderName:
    """Reads a provider's name as a user types it ("runpod", "Vast.ai", "lambda").

    Raises:
        ValueError: Not a provider Rentune knows; the message lists them.
    """
    key = text.strip().lower().removesuffix(".ai")
    for name in ProviderName:
        if key == name.value:
            return name
    raise ValueError(f"unknown provider {text!r}; use one of: {', '.join(n.value for n in ProviderName)}")


def open_provider(
    name: ProviderName,
    secrets: SecretStore | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    retry: RetryPolicy | None = None,
    api_key: str | None = None,
) -> Provider:
    """A client for ``name`` with the user's key (or ``api_key``), at the URL the environment says.

    Raises:
        MissingKeyError: No key in the keyring or the environment.
        SecretStoreError: The keyring cannot be used and no variable is set.
    """
    info = PROVIDERS[name]
    key = api_key or (secrets or SecretStore()).get(info.secret)
    if not key:
        raise MissingKeyError(
            name,
            f"no API key; run rentune keys set {name.value} (or set {info.secret.env_var}); get one at {info.console}",
        )
    cls = getattr(import_module(info.module), info.class_name)
    extra: dict[str, Any] = {"graphql_url": info.graphql_url} if info.graphql_url else {}
    provider: Provider = cls(key, info.url, transport=transport, retry=retry, **extra)
    return provider


def provider_of_secret(secret: SecretName) -> ProviderName | None:
    """The provider whose API key ``secret`` is (None for the Hugging Face token)."""
    return next((info.name for info in PROVIDERS.values() if info.secret is secret), None)


async def check_api_key(name: ProviderName, key: str) -> None:
    """Makes the provider's cheap authenticated call with ``key`` (before it is stored).

    Raises:
        AuthError: The provider refused the key.
        ProviderError: The provider cannot be reached or failed.
    """
    provider = open_provider(name, api_key=key)
    try:
        await provider.check_key()
    finally:
        await provider.aclose()
