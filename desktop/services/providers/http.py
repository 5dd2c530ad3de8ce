"""The HTTP side shared by every provider client: auth header, retries with backoff, errors in Rentune's types.

429 and 5xx answers are retried with exponential backoff, honouring ``Retry-After``, except for a request that must
not be repeated (a create), which retries only 429s; 401 and 403 become :class:`~.base.AuthError`; a provider that
cannot be reached becomes a :class:`~.base.ProviderError` naming it, and a request sent whose answer never came (or
came as a 5xx) an :class:`~.base.UncertainOutcomeError`.
The transport is injectable (``httpx`` ``transport=``), so tests can answer in-process.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from desktop.services.providers.base import (
    AuthError,
    ProviderError,
    ProviderName,
    RateLimitedError,
    UncertainOutcomeError,
)

RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
#: What a request that must not be repeated (a create) retries: a 429 is answered before the provider acts.
ONCE_RETRIED_STATUSES = frozenset({429})

#: Waits a number of seconds (``asyncio.sleep``; tests pass one that moves a fake clock instead).
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a refused request.

    Attributes:
        attempts: Tries in all (the first one included).
        first_delay: Seconds before the second try; each later wait is ``factor`` times longer.
        factor: Growth of the wait.
        max_delay: The longest single wait (a longer ``Retry-After`` is cut to it).
    """

    attempts: int = 5
    first_delay: float = 0.5
    factor: float = 2.0
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed try number ``attempt`` (0-based)."""
        wait = retry_after if retry_after is not None else self.first_delay * self.factor**attempt
        return min(max(wait, 0.0), self.max_delay)


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds (a number or an HTTP date), or None."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


class ApiClient:
    """An ``httpx.AsyncClient`` for one provider, with Bearer auth and retries."""

    def __init__(
        self,
        provider: ProviderName,
        base_url: str,
        api_key: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """Creates the client.

        Args:
            provider: Whose API (for error messages).
            base_url: The API's root URL.
            api_key: Sent as ``Authorization: Bearer``; never logged.
            transport: Replaces the network (tests).
            retry: Retry timing.
            timeout: Seconds per request.
            sleep: Waits between retries (tests pass one that moves a fake clock).
        """
        self.provider = provider
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            transport=transport,
            timeout=timeout,
        )

    async def request(
        self, method: str, path: str, *, json: Any = None, params: Any = None, once: bool = False
    ) -> httpx.Response:
        """Sends a request, retrying 429 and 5xx; returns any other answer (the caller reads 4xx bodies).

        Args:
            method: HTTP method.
            path: Below the base URL.
            json: The body.
            params: Query parameters.
            once: The request must not be repeated once the provider may have acted on it (a create): only a 429,
                which a provider answers before acting, is retried; a 5xx or a lost answer raises
                :class:`~.base.UncertainOutcomeError` at once.

        Raises:
            AuthError: 401 or 403.
            RateLimitedError: Still 429 after every retry.
            UncertainOutcomeError: Sent, then no answer or a 5xx (after the retries, or at once with ``once``).
            ProviderError: Unreachable (nothing was sent).
        """
        retried = ONCE_RETRIED_STATUSES if once else RETRIED_STATUSES
        for attempt in range(self.retry.attempts):
            response = await self._send(method, path, json, params)
            if response.status_code not in retried:
                break
            if attempt + 1 < self.retry.attempts:
                await self._sleep(self.retry.delay(attempt, retry_after_seconds(response)))
        if response.status_code in (401, 403):
            reason = error_text(response)
            raise AuthError(
                self.provider,
                f"the API key was refused ({reason}); store a valid one in the app's Settings or with "
                f"rentune keys set {self.provider.value}",
                reason,
            )
        if response.status_code == 429:
            raise RateLimitedError(self.provider, f"rate limited ({error_text(response)}); try again in a minute")
        if response.status_code >= 500:
            raise UncertainOutcomeError(self.provider, f"server error {response.status_code}: {error_text(response)}")
        return response

    async def _send(self, method: str, path: str, json: Any, params: Any) -> httpx.Response:
        try:
            return await self._client.request(method, path, json=json, params=params)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol) as exc:
            raise ProviderError(
                self.provider, f"cannot reach {self._client.base_url} ({exc or type(exc).__name__}); check the network"
            ) from exc
        except httpx.TimeoutException as exc:  # sent: the provider may have acted on it
            raise UncertainOutcomeError(self.provider, f"no answer in time from {self._client.base_url}") from exc
        except httpx.TransportError as exc:  # the connection dropped after the request went out
            raise UncertainOutcomeError(
                self.provider, f"the connection to {self._client.base_url} dropped ({exc or type(exc).__name__})"
            ) from exc

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._client.aclose()


def error_text(response: httpx.Response) -> str:
    """The most useful words of an error answer: a JSON ``message``/``msg``/``detail``/``error``, else the body's start.

    ``detail`` is how Vast words its 429s (``{"detail": ...}``).
    """
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict):  # Lambda: {"error": {"code", "message", "suggestion"}}
            return str(inner.get("message") or inner.get("code") or inner)
        for key in ("message", "msg", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)[:300]
