"""RunPod's GraphQL API (``POST https://api.runpod.io/graphql``), kept **only for spot** pods.

RunPod's REST API v2 (:mod:`.runpod`) covers everything else, but it has no spot, interruptible or bid equivalent:
its pod body refuses an ``interruptible`` field and its catalog has no bid price. So spot prices (``gpuTypes`` with
``lowestPrice.minimumBidPrice``) and spot rentals (``podRentInterruptable``) still go through GraphQL, and every
GraphQL text Rentune sends lives in this module. RunPod retires GraphQL in early 2027 (it then answers 410 Gone) and
is already withdrawing spot, so the caller treats this API as possibly gone: a spot query that fails in any way
yields no spot offers (said in so many words, see :class:`~.base.SpotUnavailableError`), never a failed run. When
GraphQL is retired, this module goes with it.

Operations are posted to the endpoint exactly as given, ``https://api.runpod.io/graphql`` with no trailing slash, as
runpodctl (``DefaultGraphQLURL``) and runpod-python (``f"{base}/graphql"``) post them: an httpx base URL with an
empty path would add a slash, and ``/graphql/`` is not the route RunPod documents.

Operations take GraphQL variables (typed inputs), never interpolated strings. RunPod answers most client errors with
HTTP 200 and ``errors``; :func:`error_for` turns their messages into Rentune's errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

from desktop.services.providers.base import (
    AuthError,
    BidTooLowError,
    NoCapacityError,
    ProviderError,
    ProviderName,
    RentRequest,
    UncertainOutcomeError,
)
from desktop.services.providers.http import ApiClient, RetryPolicy, error_text

#: The GraphQL endpoint when no override is given.
DEFAULT_GRAPHQL_URL = "https://api.runpod.io/graphql"

# -- GraphQL text (all of it) ----------------------------------------------------------------------------------------

SPOT_OFFERS_QUERY = """
query SpotGpuTypes($lowestPriceInput: GpuLowestPriceInput) {
  gpuTypes {
    id displayName memoryInGb maxGpuCount secureSpotPrice communitySpotPrice
    lowestPrice(input: $lowestPriceInput) { minimumBidPrice stockStatus countryCode }
  }
}
"""

RENT_SPOT_MUTATION = """
mutation RentSpot($input: PodRentInterruptableInput!) {
  podRentInterruptable(input: $input) { id name desiredStatus costPerHr }
}
"""

# -- errors ----------------------------------------------------------------------------------------------------------

NO_CAPACITY_WORDS = ("no longer any instances available", "no instances available", "not enough free gpus")
AUTH_WORDS = re.compile(r"unauthori[sz]ed|unauthenticated|not authori[sz]ed|forbidden|invalid api key|\b40[13]\b")
AUTH_CODES = frozenset({"UNAUTHENTICATED", "FORBIDDEN"})


def error_for(errors: list[Any]) -> ProviderError:
    """The Rentune error for a GraphQL ``errors`` list (its first message decides; every message is kept)."""
    messages = [str(e.get("message", e)) if isinstance(e, dict) else str(e) for e in errors] or ["unknown error"]
    message = "; ".join(messages)
    lower = message.lower()
    codes = {str((e.get("extensions") or {}).get("code", "")) for e in errors if isinstance(e, dict)}
    if any(word in lower for word in NO_CAPACITY_WORDS):
        return NoCapacityError(ProviderName.RUNPOD, f"{message} (pick another GPU or cloud, or try again later)")
    if codes & AUTH_CODES or AUTH_WORDS.search(lower):
        return AuthError(ProviderName.RUNPOD, f"the API key was refused ({message}); run rentune keys set runpod")
    if "bid" in lower and ("low" in lower or "minimum" in lower):
        return BidTooLowError(ProviderName.RUNPOD, f"{message} (bid at least the offer's current spot price)")
    return ProviderError(ProviderName.RUNPOD, message)


# -- what the spot calls give back -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpotGpu:
    """One GPU type's spot terms in one cloud, for one GPU count.

    Attributes:
        gpu_id: RunPod's GPU type id ("NVIDIA GeForce RTX 4090").
        name: Its display name ("RTX 4090").
        vram_gb: Memory per GPU.
        max_count: The most GPUs one pod of this type can have (None where RunPod does not say).
        price_per_gpu: The lowest winning bid per GPU per hour (None where spot is not sold).
        in_stock: Whether RunPod reports stock for the count asked.
        country: Where the cheapest machine is (None where RunPod does not say).
    """

    gpu_id: str
    name: str
    vram_gb: float
    max_count: int | None
    price_per_gpu: float | None
    in_stock: bool
    country: str | None


@dataclass(frozen=True)
class SpotPod:
    """A pod just rented as spot, as GraphQL answers it.

    Attributes:
        pod_id: RunPod's pod id.
        name: Its name (the rent request's label).
        status: GraphQL's ``desiredStatus`` ("CREATED", "RUNNING", ..., "DEAD").
        price_per_hour: ``costPerHr`` for the whole pod (None where not given).
    """

    pod_id: str
    name: str
    status: str
    price_per_hour: float | None


def _positive(*values: Any) -> float | None:
    """The first value that is a positive price (RunPod says 0 or null for "not sold")."""
    for value in values:
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def spot_gpu_from(gpu_type: dict[str, Any], cloud: str) -> SpotGpu:
    """A ``GpuType`` (with ``lowestPrice`` asked for one cloud and count) as :class:`SpotGpu`."""
    lowest = gpu_type.get("lowestPrice") or {}
    max_count = gpu_type.get("maxGpuCount")
    return SpotGpu(
        gpu_id=str(gpu_type["id"]),
        name=str(gpu_type.get("displayName") or gpu_type["id"]),
        vram_gb=float(gpu_type.get("memoryInGb") or 0),
        max_count=max_count if isinstance(max_count, int) else None,
        price_per_gpu=_positive(lowest.get("minimumBidPrice"), gpu_type.get(f"{cloud.lower()}SpotPrice")),
        in_stock=lowest.get("stockStatus") is not None,
        country=str(lowest["countryCode"]) if lowest.get("countryCode") else None,
    )


def spot_input(request: RentRequest, gpu_id: str, cloud: str, count: int, bid_per_gpu: float) -> dict[str, Any]:
    """The ``PodRentInterruptableInput`` for a request: the run's key as ``PUBLIC_KEY``, SSH on ``22/tcp``."""
    return {
        "name": request.label,
        "imageName": request.image,
        "gpuTypeId": gpu_id,
        "cloudType": cloud,
        "gpuCount": count,
        "containerDiskInGb": request.disk_gb,
        "volumeInGb": 0,
        "supportPublicIp": True,
        "startSsh": True,
        "ports": "22/tcp",
        "env": [{"key": "PUBLIC_KEY", "value": request.public_key.strip()}],
        "bidPerGpu": round(bid_per_gpu, 4),
    }


# -- the client ------------------------------------------------------------------------------------------------------


class RunPodGraphQL:
    """RunPod's GraphQL endpoint, for spot prices and spot rentals only (see the module docstring)."""

    def __init__(
        self,
        api_key: str,
        url: str = DEFAULT_GRAPHQL_URL,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Creates the client.

        Args:
            api_key: The RunPod API key (sent as a Bearer token, never logged).
            url: The GraphQL endpoint.
            transport: Replaces the network (tests).
            retry: Retry timing for 429 and 5xx.
        """
        self.url = url.rstrip("/")
        self._api = ApiClient(ProviderName.RUNPOD, self.url, api_key, transport=transport, retry=retry)

    async def run(self, query: str, variables: dict[str, Any] | None = None, *, once: bool = False) -> dict[str, Any]:
        """Runs one GraphQL operation and returns its ``data``.

        Args:
            query: The operation's text.
            variables: Its variables.
            once: Never repeat it once RunPod may have acted on it (a rental).

        Raises:
            AuthError: The key is refused (401/403, or an auth error in ``errors``).
            NoCapacityError: RunPod has no machine left for the request.
            BidTooLowError: A spot bid under the current price.
            UncertainOutcomeError: Sent, then no answer or a 5xx.
            ProviderError: Any other error (GraphQL gone: 404, 410), with RunPod's message.
        """
        payload = {"query": query, "variables": variables or {}}
        response = await self._api.request("POST", self.url, json=payload, once=once)  # absolute: no slash added
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("errors"):
            raise error_for(list(body["errors"]))
        if response.status_code >= 400 or not isinstance(body, dict) or not isinstance(body.get("data"), dict):
            raise ProviderError(ProviderName.RUNPOD, f"GraphQL answered {response.status_code}: {error_text(response)}")
        data: dict[str, Any] = body["data"]
        return data

    async def spot_gpus(self, cloud: str, count: int) -> list[SpotGpu]:
        """Every GPU type's spot terms in ``cloud`` (SECURE or COMMUNITY) for ``count`` GPUs.

        Raises:
            ProviderError: GraphQL failed or is gone (the caller offers no spot then).
        """
        variables = {"lowestPriceInput": {"gpuCount": count, "secureCloud": cloud == "SECURE"}}
        data = await self.run(SPOT_OFFERS_QUERY, variables)
        types = [t for t in data.get("gpuTypes") or [] if isinstance(t, dict) and t.get("id")]
        return [spot_gpu_from(t, cloud) for t in types]

    async def rent_spot(self, request: RentRequest, gpu_id: str, cloud: str, count: int, bid: float) -> SpotPod:
        """Rents an interruptible pod bidding ``bid`` for the whole machine (sent once: only a 429 is retried).

        Raises:
            NoCapacityError: No machine left for the offer.
            BidTooLowError: The bid is under the current price.
            UncertainOutcomeError: No answer, or a 5xx: a pod may exist; look it up by ``request.label``.
            ProviderError: Any other refusal, or GraphQL is gone.
        """
        variables = {"input": spot_input(request, gpu_id, cloud, count, bid / count)}
        await request.sending()
        data = await self.run(RENT_SPOT_MUTATION, variables, once=True)
        pod = data.get("podRentInterruptable")
        if not isinstance(pod, dict) or not pod.get("id"):
            raise UncertainOutcomeError(
                ProviderName.RUNPOD, f"RunPod took the spot pod but named none; it may exist as {request.label}"
            )
        cost = pod.get("costPerHr")
        price = float(cost) if isinstance(cost, int | float) else None
        return SpotPod(str(pod["id"]), str(pod.get("name") or ""), str(pod.get("desiredStatus") or ""), price)

    async def aclose(self) -> None:
        """Closes the HTTP client."""
        await self._api.aclose()
