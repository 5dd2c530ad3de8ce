"""RunPod through its GraphQL API (``POST https://api.runpod.io/graphql``), in Rentune's types.

Every GraphQL text RunPod is sent lives in this module, so a later move to REST v2 touches only here. Operations
take GraphQL variables (typed inputs such as ``PodFindAndDeployOnDemandInput``), never interpolated strings.

RunPod answers most client errors with HTTP 200 and ``errors``; :func:`error_for` turns their messages into
:class:`~.base.NoCapacityError`, :class:`~.base.AuthError`, :class:`~.base.BidTooLowError` or a plain
:class:`~.base.ProviderError` that keeps RunPod's words.

An offer's ``offer_id`` is ``"<gpuTypeId>|<SECURE or COMMUNITY>|<gpu count>"``, e.g.
``"NVIDIA GeForce RTX 4090|SECURE|1"``: everything :meth:`RunPodProvider.create` needs besides the spot flag,
which the offer carries itself. A pod is spot when its ``podType`` is ``INTERRUPTABLE`` (on-demand pods are
``RESERVED``).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from desktop.services.providers.base import (
    AuthError,
    BidTooLowError,
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderError,
    ProviderName,
    RentRequest,
    SshAddress,
    offer_matches,
)
from desktop.services.providers.http import ApiClient, RetryPolicy, error_text

SSH_USER = "root"
CLOUDS = ("SECURE", "COMMUNITY")

# -- GraphQL text (all of it) ----------------------------------------------------------------------------------------

POD_FIELDS = """
  id name desiredStatus podType costPerHr
  runtime { ports { ip isIpPublic privatePort publicPort type } }
  machine { gpuDisplayName }
"""

OFFERS_QUERY = """
query GpuTypes($lowestPriceInput: GpuLowestPriceInput, $gpuTypesInput: GpuTypeFilter) {
  gpuTypes(input: $gpuTypesInput) {
    id displayName memoryInGb maxGpuCount securePrice communityPrice secureSpotPrice communitySpotPrice
    lowestPrice(input: $lowestPriceInput) { minimumBidPrice uninterruptablePrice stockStatus countryCode }
  }
}
"""

DEPLOY_ON_DEMAND = f"""
mutation Deploy($input: PodFindAndDeployOnDemandInput!) {{
  podFindAndDeployOnDemand(input: $input) {{ {POD_FIELDS} }}
}}
"""

RENT_INTERRUPTABLE = f"""
mutation RentSpot($input: PodRentInterruptableInput!) {{
  podRentInterruptable(input: $input) {{ {POD_FIELDS} }}
}}
"""

POD_QUERY = f"query Pod($input: PodFilter!) {{ pod(input: $input) {{ {POD_FIELDS} }} }}"
PODS_QUERY = f"query Pods {{ myself {{ pods {{ {POD_FIELDS} }} }} }}"
MYSELF_QUERY = "query Myself { myself { id } }"
STOP_MUTATION = "mutation Stop($input: PodStopInput!) { podStop(input: $input) { id desiredStatus } }"
TERMINATE_MUTATION = "mutation Terminate($input: PodTerminateInput!) { podTerminate(input: $input) }"

# -- errors ----------------------------------------------------------------------------------------------------------

NO_CAPACITY_WORDS = ("no longer any instances available", "not enough free gpus")
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


def _not_found(error: ProviderError) -> bool:
    return "not found" in error.message.lower()


# -- offers ----------------------------------------------------------------------------------------------------------


def _positive(*values: Any) -> float | None:
    """The first value that is a positive price (RunPod says 0 or null for "not sold")."""
    for value in values:
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def _gpu_price(gpu_type: dict[str, Any], cloud: str, spot: bool) -> float | None:
    """Dollars per GPU per hour for ``cloud`` (SECURE or COMMUNITY), or None where that kind is not sold."""
    lowest = gpu_type.get("lowestPrice") or {}
    prefix = cloud.lower()
    if spot:
        return _positive(lowest.get("minimumBidPrice"), gpu_type.get(f"{prefix}SpotPrice"))
    return _positive(gpu_type.get(f"{prefix}Price"), lowest.get("uninterruptablePrice"))


def _location(cloud: str, country: str | None) -> str:
    words = f"{cloud.lower()} cloud"
    return f"{words} ({country})" if country else words


def offer_from(gpu_type: dict[str, Any], cloud: str, count: int, spot: bool) -> Offer | None:
    """One offer for a GPU type in one cloud, or None where RunPod does not sell that kind or count."""
    price = _gpu_price(gpu_type, cloud, spot)
    max_count = gpu_type.get("maxGpuCount")
    if price is None or (isinstance(max_count, int) and count > max_count):
        return None
    lowest = gpu_type.get("lowestPrice") or {}
    return Offer(
        provider=ProviderName.RUNPOD,
        offer_id=f"{gpu_type['id']}|{cloud}|{count}",
        gpu=str(gpu_type.get("displayName") or gpu_type["id"]),
        gpu_id=str(gpu_type["id"]),
        count=count,
        vram_gb=float(gpu_type.get("memoryInGb") or 0),
        price_per_hour=round(price * count, 4),
        spot=spot,
        reliability=None,
        location=_location(cloud, lowest.get("countryCode")),
        in_stock=lowest.get("stockStatus") is not None,
    )


# -- pods ------------------------------------------------------------------------------------------------------------


def _ssh_address(pod: dict[str, Any]) -> SshAddress | None:
    ports = (pod.get("runtime") or {}).get("ports") or []
    for port in ports:
        if port.get("privatePort") == 22 and port.get("isIpPublic") and port.get("ip") and port.get("publicPort"):
            return SshAddress(str(port["ip"]), int(port["publicPort"]), SSH_USER)
    return None


def pod_state(pod: dict[str, Any]) -> InstanceState:
    """Rentune's state for a pod: ``runtime`` is null until its container is up."""
    status = pod.get("desiredStatus")
    if status == "TERMINATED":
        return InstanceState.TERMINATED
    if status in ("EXITED", "PAUSED"):
        return InstanceState.STOPPED
    if status == "RUNNING" and pod.get("runtime"):
        return InstanceState.RUNNING
    return InstanceState.STARTING  # CREATED, RESTARTING, or RUNNING with no runtime yet


def instance_from(pod: dict[str, Any]) -> Instance:
    """An :class:`Instance` from a pod object (the fields of ``POD_FIELDS``)."""
    return Instance(
        provider=ProviderName.RUNPOD,
        instance_id=str(pod["id"]),
        name=str(pod.get("name") or ""),
        state=pod_state(pod),
        price_per_hour=float(pod.get("costPerHr") or 0.0),
        gpu=str((pod.get("machine") or {}).get("gpuDisplayName") or ""),
        spot=pod.get("podType") == "INTERRUPTABLE",
        ssh=_ssh_address(pod),
        status_text=str(pod.get("desiredStatus") or ""),
    )


def gone(instance_id: str) -> Instance:
    """The instance RunPod no longer knows."""
    return Instance(ProviderName.RUNPOD, instance_id, "", InstanceState.TERMINATED, 0.0, status_text="not found")


def deploy_input(request: RentRequest) -> dict[str, Any]:
    """The ``PodFindAndDeployOnDemandInput`` for a request (spot adds ``bidPerGpu``)."""
    gpu_type_id, cloud, count = _parse_offer_id(request.offer.offer_id)
    return {
        "name": request.label,
        "imageName": request.image,
        "gpuTypeId": gpu_type_id,
        "cloudType": cloud,
        "gpuCount": count,
        "containerDiskInGb": request.disk_gb,
        "volumeInGb": 0,
        "supportPublicIp": True,
        "startSsh": True,
        "ports": "22/tcp",
        "env": [{"key": "PUBLIC_KEY", "value": request.public_key.strip()}],
    }


def _parse_offer_id(offer_id: str) -> tuple[str, str, int]:
    try:
        gpu_type_id, cloud, count = offer_id.rsplit("|", 2)
        if cloud not in CLOUDS:
            raise ValueError(cloud)
        return gpu_type_id, cloud, int(count)
    except ValueError as exc:
        raise ProviderError(
            ProviderName.RUNPOD, f"not a RunPod offer id: {offer_id!r}; pick an offer from the RunPod list"
        ) from exc


def spot_bid(request: RentRequest) -> float | None:
    """The bid for the whole machine, or None for on-demand.

    A spot offer rented with no bid bids the offer's price (the lowest bid that wins it now), so a spot offer is
    never silently rented on-demand; a bid on an on-demand offer is ignored.
    """
    if not request.offer.spot:
        return None
    return request.bid_per_hour if request.bid_per_hour is not None else request.offer.price_per_hour


# -- the client ------------------------------------------------------------------------------------------------------


class RunPodProvider:
    """RunPod's pods: offers from ``gpuTypes``, pods created, watched, stopped and terminated through GraphQL."""

    name = ProviderName.RUNPOD

    def __init__(
        self,
        api_key: str,
        base_url: str = "https://api.runpod.io/graphql",
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Creates the client.

        Args:
            api_key: The RunPod API key (sent as a Bearer token, never logged).
            base_url: The GraphQL endpoint.
            transport: Replaces the network (tests).
            retry: Retry timing for 429 and 5xx.
        """
        self._api = ApiClient(ProviderName.RUNPOD, base_url, api_key, transport=transport, retry=retry)

    async def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """Runs one GraphQL operation and returns its ``data``.

        Raises:
            AuthError: The key is refused (401/403, or an auth error in ``errors``).
            NoCapacityError: RunPod has no machine left for the request.
            BidTooLowError: A spot bid under the current price.
            ProviderError: Any other error, with RunPod's message.
        """
        body, response = await self._post(query, variables)
        if isinstance(body, dict) and body.get("errors"):
            raise error_for(list(body["errors"]))
        if response.status_code >= 400 or not isinstance(body, dict) or not isinstance(body.get("data"), dict):
            raise ProviderError(self.name, f"unexpected answer {response.status_code}: {error_text(response)}")
        data: dict[str, Any] = body["data"]
        return data

    async def _post(self, query: str, variables: dict[str, Any] | None) -> tuple[Any, httpx.Response]:
        response = await self._api.request("POST", "", json={"query": query, "variables": variables or {}})
        try:
            return response.json(), response
        except ValueError:
            return None, response

    async def check_key(self) -> None:
        """Asks who the key belongs to.

        Raises:
            AuthError: The key is refused.
            ProviderError: RunPod cannot be reached or failed.
        """
        body, response = await self._post(MYSELF_QUERY, None)
        if not isinstance(body, dict):
            raise ProviderError(self.name, f"unexpected answer {response.status_code}: {error_text(response)}")
        if body.get("errors"):
            refusal = error_for(list(body["errors"]))
            if isinstance(refusal, AuthError):
                raise refusal
            raise AuthError(self.name, f"the API key was refused ({refusal.message}); run rentune keys set runpod")
        if not (body.get("data") or {}).get("myself"):
            raise AuthError(self.name, "the API key belongs to no RunPod account; run rentune keys set runpod")

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """GPU types in secure and community cloud priced for ``query`` (out-of-stock ones marked).

        RunPod prices a count it is asked for, so a query with no count gets 1-GPU offers.
        """
        count = query.count or 1
        answers = await asyncio.gather(*(self._gpu_types(cloud, count) for cloud in CLOUDS))
        found = []
        for cloud, gpu_types in zip(CLOUDS, answers, strict=True):
            for gpu_type in gpu_types:
                offer = offer_from(gpu_type, cloud, count, query.spot)
                if offer is not None and offer_matches(offer, query):
                    found.append(offer)
        return found

    async def _gpu_types(self, cloud: str, count: int) -> list[dict[str, Any]]:
        variables = {"lowestPriceInput": {"gpuCount": count, "secureCloud": cloud == "SECURE"}, "gpuTypesInput": None}
        data = await self.graphql(OFFERS_QUERY, variables)
        return [t for t in data.get("gpuTypes") or [] if isinstance(t, dict) and t.get("id")]

    async def create(self, request: RentRequest) -> Instance:
        """Deploys a pod on-demand, or rents it interruptible at ``bid / count`` per GPU for spot offers.

        Raises:
            NoCapacityError: RunPod has no machine left for the offer.
            BidTooLowError: The spot bid is below the current price.
        """
        variables = deploy_input(request)
        bid = spot_bid(request)
        if bid is None:
            data = await self.graphql(DEPLOY_ON_DEMAND, {"input": variables})
            pod = data.get("podFindAndDeployOnDemand")
        else:
            variables["bidPerGpu"] = round(bid / variables["gpuCount"], 4)
            data = await self.graphql(RENT_INTERRUPTABLE, {"input": variables})
            pod = data.get("podRentInterruptable")
        if not isinstance(pod, dict) or not pod.get("id"):
            raise ProviderError(self.name, "RunPod accepted the pod but returned no id; check the RunPod console")
        return instance_from(pod)

    async def get(self, instance_id: str) -> Instance:
        """The pod now (TERMINATED when RunPod no longer knows it)."""
        try:
            data = await self.graphql(POD_QUERY, {"input": {"podId": instance_id}})
        except ProviderError as exc:
            if type(exc) is ProviderError and _not_found(exc):
                return gone(instance_id)
            raise
        pod = data.get("pod")
        return instance_from(pod) if isinstance(pod, dict) else gone(instance_id)

    async def stop(self, instance_id: str) -> None:
        """Stops the pod (its container disk is kept and bills storage)."""
        await self.graphql(STOP_MUTATION, {"input": {"podId": instance_id}})

    async def terminate(self, instance_id: str) -> None:
        """Destroys the pod; "pod not found" means it is already gone."""
        try:
            await self.graphql(TERMINATE_MUTATION, {"input": {"podId": instance_id}})
        except ProviderError as exc:
            if type(exc) is ProviderError and _not_found(exc):
                return
            raise

    async def instances(self) -> list[Instance]:
        """Every pod of the account (terminated ones are no longer listed by RunPod)."""
        data = await self.graphql(PODS_QUERY)
        pods = (data.get("myself") or {}).get("pods") or []
        return [instance_from(pod) for pod in pods if isinstance(pod, dict) and pod.get("id")]

    async def aclose(self) -> None:
        """Closes the HTTP client."""
        await self._api.aclose()
