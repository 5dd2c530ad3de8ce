"""RunPod through its REST API v2 (``https://api.runpod.io/v2``), in Rentune's types.

Pods are created, read, listed, stopped and deleted under ``/pods``; on-demand prices and stock come from
``GET /catalog/gpus?include=AVAILABILITY&product=POD`` (asked once per cloud, for the GPU count wanted). v2 has no
spot: spot prices and spot rentals go through GraphQL in :mod:`.runpod_graphql`, and only while that API answers
(RunPod retires it in early 2027); a spot query that fails raises :class:`~.base.SpotUnavailableError` (no spot
offers, and why), never an error for on-demand offers.

A few habits of v2 shape this module:

- Errors are RFC 9457 problem bodies ``{"title", "status", "detail", "errors"?}``; ``detail`` is kept in messages.
- No capacity is a 400 whose ``detail`` says so (there is no machine-readable code); 402 is an empty balance.
- A create is sent once (:meth:`~.http.ApiClient.request` with ``once=True``): after a 5xx or a lost answer the
  pod may exist, and :meth:`RunPodProvider.named` finds it by its name, which is the request's label.
- ``GET /pods`` has no name filter, so :meth:`RunPodProvider.named` lists every pod and filters here.
- Clusters are not under ``/pods``: pods and clusters are listed apart (:meth:`RunPodProvider.listing`), and one
  list failing leaves the other listed, with a note (:mod:`.listing`).
- A deleted pod answers 404 (a problem body): it is gone, which is what a terminate wants.
- The pod object does not say whether a pod is spot, nor when it stopped billing, so ``Instance.spot`` is only set
  on the answer to a spot create and ``Instance.ended_at`` stays None; ``created_at`` is ``createdAt``.

An offer's ``offer_id`` is ``"<gpuTypeId>|<SECURE or COMMUNITY>|<gpu count>"``, e.g.
``"NVIDIA GeForce RTX 4090|SECURE|1"``: everything :meth:`RunPodProvider.create` needs besides the spot flag,
which the offer carries itself.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from desktop.services.providers.base import (
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderError,
    ProviderName,
    RentRequest,
    SpotUnavailableError,
    SshAddress,
    UncertainOutcomeError,
    offer_matches,
)
from desktop.services.providers.http import ApiClient, RetryPolicy, error_text
from desktop.services.providers.listing import Listing, listed_apart, logged, read_rows, rows_in, unread_row
from desktop.services.providers.runpod_clusters import (
    ClusterMember,
    cluster_id_of,
    cluster_offer_id,
    create_cluster_body,
    instance_from_cluster,
    is_cluster_id,
    members_from,
    parse_cluster_offer_id,
)
from desktop.services.providers.runpod_graphql import (
    DEFAULT_GRAPHQL_URL,
    NO_CAPACITY_WORDS,
    RunPodGraphQL,
    SpotGpu,
    SpotPod,
)

log = logging.getLogger(__name__)

RUNPOD = ProviderName.RUNPOD
DEFAULT_URL = "https://api.runpod.io/v2"
SSH_USER = "root"
CLOUDS = ("SECURE", "COMMUNITY")
BILLING_CONSOLE = "https://www.runpod.io/console/user/billing"

#: RunPod's pod statuses in Rentune's words: REST v2 ``PodStatus``, then GraphQL's ``desiredStatus`` (the answer to a
#: spot rental). ERROR and DEAD never come back, EXITED has released its GPU: a wait for any of them ends at once.
POD_STATES: dict[str, InstanceState] = {
    "PROVISIONING": InstanceState.STARTING,
    "STARTING": InstanceState.STARTING,
    "RUNNING": InstanceState.RUNNING,
    "EXITED": InstanceState.STOPPED,
    "ERROR": InstanceState.FAILED,
    "TERMINATED": InstanceState.TERMINATED,
    "CREATED": InstanceState.STARTING,
    "RESTARTING": InstanceState.STARTING,
    "PAUSED": InstanceState.STOPPED,
    "DEAD": InstanceState.FAILED,
}
#: A status RunPod adds later reads as starting: the pod is neither given up on nor forgotten while it may bill, and
#: a wait for it ends at the caller's ready timeout (which terminates it); ``status_text`` keeps RunPod's word.
UNKNOWN_STATE = InstanceState.STARTING

_AVAILABILITY_RANK = {"NONE": 0, "LOW": 1, "MEDIUM": 2, "HIGH": 3}
_BRAND_WORDS = frozenset({"NVIDIA", "GEFORCE", "AMD", "RADEON"})

# -- offers ----------------------------------------------------------------------------------------------------------


def offer_id_of(gpu_id: str, cloud: str, count: int) -> str:
    """The offer id for a GPU type in a cloud at a count (see the module docstring)."""
    return f"{gpu_id}|{cloud}|{count}"


def parse_offer_id(offer_id: str) -> tuple[str, str, int]:
    """The GPU type id, cloud and GPU count of an offer id.

    Raises:
        ProviderError: Not a RunPod offer id.
    """
    try:
        gpu_id, cloud, count = offer_id.rsplit("|", 2)
        if cloud not in CLOUDS:
            raise ValueError(cloud)
        return gpu_id, cloud, int(count)
    except ValueError as exc:
        raise ProviderError(RUNPOD, f"not a RunPod offer id: {offer_id!r}; pick an offer from the RunPod list") from exc


def _positive(value: Any) -> float | None:
    """A positive price, or None (RunPod says 0 or null for "not sold")."""
    return float(value) if isinstance(value, int | float) and value > 0 else None


def best_availability(gpu: dict[str, Any]) -> tuple[int, str | None]:
    """The best stock level of a catalog GPU (0 none .. 3 high) and the data centre that has it.

    The overall ``availability`` can read NONE while one data centre reads LOW, so the better of the two counts.
    """
    place, place_level = None, 0
    for centre in gpu.get("dataCenters") or []:
        level = _AVAILABILITY_RANK.get(str(centre.get("availability")), 0) if isinstance(centre, dict) else 0
        if level > place_level:
            place, place_level = str(centre.get("id") or "") or None, level
    return max(_AVAILABILITY_RANK.get(str(gpu.get("availability")), 0), place_level), place


def _location(cloud: str, place: str | None) -> str:
    words = f"{cloud.lower()} cloud"
    return f"{words} ({place})" if place else words


def offer_from(gpu: dict[str, Any], cloud: str, count: int) -> Offer | None:
    """An on-demand offer from a ``/catalog/gpus`` entry asked for ``cloud`` and ``count`` (None: not sold so)."""
    key = cloud.lower()
    price = _positive((gpu.get("price") or {}).get(key))
    max_count = (gpu.get("maxCount") or {}).get(key)
    if gpu.get(key) is False or price is None or (isinstance(max_count, int) and count > max_count):
        return None
    level, place = best_availability(gpu)
    return Offer(
        provider=RUNPOD,
        offer_id=offer_id_of(str(gpu["id"]), cloud, count),
        gpu=str(gpu.get("name") or gpu["id"]),
        gpu_id=str(gpu["id"]),
        count=count,
        vram_gb=float(gpu.get("memory") or 0),
        price_per_hour=round(price * count, 4),
        spot=False,
        reliability=None,
        location=_location(cloud, place),
        in_stock=level > 0,
    )


def spot_offer_from(gpu: SpotGpu, cloud: str, count: int) -> Offer | None:
    """A spot offer from GraphQL's spot terms (None where spot is not sold or the count is too large)."""
    if gpu.price_per_gpu is None or (gpu.max_count is not None and count > gpu.max_count):
        return None
    return Offer(
        provider=RUNPOD,
        offer_id=offer_id_of(gpu.gpu_id, cloud, count),
        gpu=gpu.name,
        gpu_id=gpu.gpu_id,
        count=count,
        vram_gb=gpu.vram_gb,
        price_per_hour=round(gpu.price_per_gpu * count, 4),
        spot=True,
        reliability=None,
        location=_location(cloud, gpu.country),
        in_stock=gpu.in_stock,
    )


# -- pods ------------------------------------------------------------------------------------------------------------


def pod_state(status: str) -> InstanceState:
    """Rentune's state for a RunPod status (see :data:`POD_STATES` and :data:`UNKNOWN_STATE`)."""
    return POD_STATES.get(status.upper(), UNKNOWN_STATE)


def epoch_of(text: Any) -> float | None:
    """Epoch seconds of an RFC 3339 time (UTC when it names no zone), or None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def ssh_address(pod: dict[str, Any]) -> SshAddress | None:
    """Where to log in: ``ssh.direct``, else the public mapping of ``22/tcp`` in ``runtime.ports``.

    The proxy in ``ssh.proxy`` carries no SCP or port forwarding, so it is never used.
    """
    direct = (pod.get("ssh") or {}).get("direct")
    if isinstance(direct, dict) and direct.get("host") and direct.get("port"):
        return SshAddress(str(direct["host"]), int(direct["port"]), str(direct.get("username") or SSH_USER))
    for port in (pod.get("runtime") or {}).get("ports") or []:
        if port.get("private") == 22 and port.get("type") == "tcp" and port.get("ip") and port.get("public"):
            return SshAddress(str(port["ip"]), int(port["public"]), SSH_USER)
    return None


def gpu_words(gpu_id: str) -> str:
    """A GPU type id as people say it: the vendor's brand words dropped ("NVIDIA GeForce RTX 4090" -> "RTX 4090").

    A pod names its GPU only by the catalog id; the catalog's own display name may be shorter still ("A100 PCIe").
    """
    words = gpu_id.split()
    while len(words) > 1 and words[0].upper() in _BRAND_WORDS:
        words = words[1:]
    return " ".join(words)


def instance_from(pod: dict[str, Any], gpu_name: str | None = None) -> Instance:
    """An :class:`Instance` from a v2 ``Pod`` (``gpu_name``: the display name, where the caller knows it)."""
    status = str(pod.get("status") or "")
    cost = pod.get("cost")
    return Instance(
        provider=RUNPOD,
        instance_id=str(pod["id"]),
        name=str(pod.get("name") or ""),
        state=pod_state(status),
        price_per_hour=float(cost) if isinstance(cost, int | float) else 0.0,
        gpu=gpu_name or gpu_words(str((pod.get("gpu") or {}).get("id") or "")),
        ssh=ssh_address(pod),
        status_text=status,
        created_at=epoch_of(pod.get("createdAt")),
    )


def spot_instance(pod: SpotPod, request: RentRequest) -> Instance:
    """The :class:`Instance` for a pod just rented as spot through GraphQL."""
    return Instance(
        provider=RUNPOD,
        instance_id=pod.pod_id,
        name=pod.name or request.label,
        state=pod_state(pod.status),
        price_per_hour=pod.price_per_hour or 0.0,
        gpu=request.offer.gpu,
        spot=True,
        status_text=pod.status,
    )


def gone(instance_id: str) -> Instance:
    """The instance RunPod no longer knows."""
    return Instance(RUNPOD, instance_id, "", InstanceState.TERMINATED, 0.0, status_text="not found")


def create_body(request: RentRequest, gpu_id: str, cloud: str, count: int) -> dict[str, Any]:
    """The ``CreatePodRequest`` for an on-demand request.

    ``gpu.count`` is always sent (without it every create fails as "no instances available"); ``22/tcp`` is listed
    because v2 opens no port by default; the run's key goes in ``env.PUBLIC_KEY``, which RunPod's images authorize
    and ``startSsh`` does not overwrite; no ``mounts``, so nothing is left billing storage once the pod is deleted.
    """
    return {
        "name": request.label,
        "image": request.image,
        "cloud": cloud,
        "gpu": {"id": gpu_id, "count": count},
        "disk": request.disk_gb,
        "ports": ["22/tcp"],
        "env": {"PUBLIC_KEY": request.public_key.strip()},
        "startSsh": True,
    }


def spot_bid(request: RentRequest) -> float | None:
    """The bid for the whole machine, or None for on-demand.

    A spot offer rented with no bid bids the offer's price (the lowest bid that wins it now), so a spot offer is
    never silently rented on-demand; a bid on an on-demand offer is ignored.
    """
    if not request.offer.spot:
        return None
    return request.bid_per_hour if request.bid_per_hour is not None else request.offer.price_per_hour


def spot_unavailable(failed: Exception) -> SpotUnavailableError:
    """Why RunPod's spot offers are missing (GraphQL failed, refused or is retired), and what to do."""
    reason = failed.message if isinstance(failed, ProviderError) else f"{type(failed).__name__}: {failed}"
    words = (
        f"RunPod's spot offers could not be listed ({reason}); RunPod is withdrawing spot: rent on-demand "
        "(spot = false) or try again later"
    )
    return SpotUnavailableError(RUNPOD, words, reason)


# -- answers ---------------------------------------------------------------------------------------------------------


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def problem_text(response: httpx.Response) -> str:
    """RunPod's words for an error: the problem body's ``detail`` and each ``errors`` entry, else the body's start."""
    body = _body(response)
    if not isinstance(body, dict) or not (body.get("detail") or body.get("title")):
        return error_text(response)
    words = str(body.get("detail") or body.get("title"))
    extra = [str(e) for e in body.get("errors") or []]
    return f"{words} ({'; '.join(extra)})" if extra else words


def is_missing(response: httpx.Response) -> bool:
    """Whether an answer is a 404 with a problem body: the pod does not exist (any more).

    A 404 without one (a wrong URL, a proxy's page) is an error instead, so a misconfigured client never takes a
    billing pod for gone.
    """
    body = _body(response)
    return response.status_code == 404 and isinstance(body, dict) and bool(body.get("detail") or body.get("title"))


def checked(response: httpx.Response, doing: str) -> dict[str, Any]:
    """The JSON object of a successful answer.

    Raises:
        ProviderError: A 4xx (with RunPod's words), or an answer that is not a JSON object.
    """
    if response.status_code >= 400:
        words = problem_text(response)
        raise ProviderError(
            RUNPOD, f"{doing} failed ({response.status_code}): {words}", words, status=response.status_code
        )
    body = _body(response)
    if not isinstance(body, dict):
        raise ProviderError(
            RUNPOD,
            f"{doing}: unexpected answer {response.status_code}: {error_text(response)}",
            status=response.status_code,
        )
    return body


def create_error(response: httpx.Response) -> ProviderError:
    """The Rentune error for a refused create (400 no capacity, 402 no balance, any other refusal)."""
    words = problem_text(response)
    status = response.status_code
    if status == 400 and any(word in words.lower() for word in NO_CAPACITY_WORDS):
        return NoCapacityError(RUNPOD, f"{words} (pick another GPU or cloud, or try again later)", words)
    if status == 402:
        return ProviderError(RUNPOD, f"the balance is too low ({words}); add funds at {BILLING_CONSOLE}", words)
    return ProviderError(RUNPOD, f"the pod was refused ({status}): {words}", words)


def next_cursor(body: dict[str, Any]) -> str | None:
    """The cursor of the next page of a list, if RunPod paginates it (the spec has no pagination yet)."""
    page = body.get("pagination")
    if isinstance(page, dict) and page.get("hasNextPage") and page.get("nextCursor"):
        return str(page["nextCursor"])
    return None


# -- the client ------------------------------------------------------------------------------------------------------


class RunPodProvider:
    """RunPod's pods through REST v2; spot offers and spot rentals through GraphQL while it answers."""

    name = ProviderName.RUNPOD

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_URL,
        *,
        graphql_url: str = DEFAULT_GRAPHQL_URL,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Creates the client.

        Args:
            api_key: The RunPod API key (sent as a Bearer token, never logged).
            base_url: The REST v2 root.
            graphql_url: The GraphQL endpoint, used only for spot.
            transport: Replaces the network (tests).
            retry: Retry timing for 429 and 5xx.
        """
        self._api = ApiClient(RUNPOD, base_url, api_key, transport=transport, retry=retry)
        self._graphql = RunPodGraphQL(api_key, graphql_url, transport=transport, retry=retry)

    async def check_key(self) -> None:
        """Lists the account's pods, the cheapest call that needs a valid key.

        Raises:
            AuthError: The key is refused.
            ProviderError: RunPod cannot be reached or failed.
        """
        checked(await self._api.request("GET", "/pods"), "checking the key")

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """Offers in secure and community cloud priced for ``query`` (out-of-stock ones marked).

        RunPod prices and stocks a count it is asked for, so a query with no count gets 1-GPU offers. Spot offers
        come from GraphQL.

        Raises:
            SpotUnavailableError: A spot query, and GraphQL did not answer it (on-demand queries never ask GraphQL).
        """
        count = query.count or 1
        if query.nodes > 1:
            found = [] if query.spot else await self._cluster_offers(count, query.nodes)  # clusters have no spot
        else:
            found = await self._spot_offers(count) if query.spot else await self._on_demand_offers(count)
        return [offer for offer in found if offer_matches(offer, query)]

    async def _cluster_offers(self, count: int, nodes: int) -> list[Offer]:
        """Instant Cluster offers: ``nodes`` pods of ``count`` GPUs, priced at every pod's GPUs together."""
        params = {"include": "AVAILABILITY", "product": "CLUSTER", "count": count}
        body = checked(await self._api.request("GET", "/catalog/gpus", params=params), "reading the cluster catalog")
        found = []
        for gpu in body.get("gpus") or []:
            single = offer_from(gpu, "SECURE", count) if isinstance(gpu, dict) and gpu.get("id") else None
            if single is not None:
                offer_id = cluster_offer_id(single.gpu_id, count, nodes)
                price = round(single.price_per_hour * nodes, 4)
                location = single.location.replace("secure cloud", "Instant Cluster")
                found.append(replace(single, offer_id=offer_id, price_per_hour=price, nodes=nodes, location=location))
        return found

    async def _on_demand_offers(self, count: int) -> list[Offer]:
        answers = await asyncio.gather(*(self._catalog(cloud, count) for cloud in CLOUDS))
        offers = (offer_from(gpu, cloud, count) for cloud, gpus in zip(CLOUDS, answers, strict=True) for gpu in gpus)
        return [offer for offer in offers if offer is not None]

    async def _catalog(self, cloud: str, count: int) -> list[dict[str, Any]]:
        params = {"include": "AVAILABILITY", "product": "POD", "count": count, "cloud": cloud}
        body = checked(await self._api.request("GET", "/catalog/gpus", params=params), "reading the GPU catalog")
        return [gpu for gpu in body.get("gpus") or [] if isinstance(gpu, dict) and gpu.get("id")]

    async def _spot_offers(self, count: int) -> list[Offer]:
        """Spot offers from GraphQL.

        Raises:
            SpotUnavailableError: GraphQL failed in any way (retired, refused, unreachable, unreadable): no spot offers,
                said in words rather than an empty list that reads as "none in stock".
        """
        answers = await asyncio.gather(*(self._graphql.spot_gpus(c, count) for c in CLOUDS), return_exceptions=True)
        failed = next((answer for answer in answers if isinstance(answer, BaseException)), None)
        if failed is not None:
            if not isinstance(failed, Exception):
                raise failed  # a cancellation, not an answer
            log.warning("RunPod spot offers left out: GraphQL did not answer for them (%s)", failed)
            raise spot_unavailable(failed)
        offers = (
            spot_offer_from(gpu, cloud, count)
            for cloud, gpus in zip(CLOUDS, answers, strict=True)
            if not isinstance(gpus, BaseException)
            for gpu in gpus
        )
        return [offer for offer in offers if offer is not None]

    async def create(self, request: RentRequest) -> Instance:
        """Creates an on-demand pod with ``POST /pods``, or rents a spot pod through GraphQL; sent once either way.

        Raises:
            NoCapacityError: RunPod has no machine left for the offer.
            BidTooLowError: The spot bid is below the current price.
            UncertainOutcomeError: No answer, a 5xx, or an answer without a pod: look it up by ``request.label``.
            ProviderError: Any other refusal, with RunPod's words.
        """
        cluster = parse_cluster_offer_id(request.offer.offer_id)
        if cluster is not None:
            return await self._create_cluster(request, *cluster)
        gpu_id, cloud, count = parse_offer_id(request.offer.offer_id)
        bid = spot_bid(request)
        if bid is not None:
            return spot_instance(await self._graphql.rent_spot(request, gpu_id, cloud, count, bid), request)
        pod = await self._created(request, "pod", create_body(request, gpu_id, cloud, count))
        return instance_from(pod, request.offer.gpu)

    async def _create_cluster(self, request: RentRequest, gpu_id: str, gpus_per_pod: int, pods: int) -> Instance:
        """Creates an Instant Cluster (``POST /clusters``, sent once); the instance is the whole cluster."""
        cluster = await self._created(request, "cluster", create_cluster_body(request, gpu_id, gpus_per_pod, pods))
        return instance_from_cluster(cluster, request.offer.price_per_hour, request.offer.gpu)

    async def _created(self, request: RentRequest, what: str, body: dict[str, Any]) -> dict[str, Any]:
        """Sends a create (``POST /pods`` or ``/clusters``) once; the pod or cluster it made.

        Raises:
            NoCapacityError, ProviderError: RunPod refused (see :func:`create_error`).
            UncertainOutcomeError: An answer that names nothing: look it up by ``request.label``.
        """
        await request.sending()
        response = await self._api.request("POST", f"/{what}s", json=body, once=True)
        if response.status_code >= 400:
            raise create_error(response)
        made = _body(response)
        if not isinstance(made, dict) or not made.get("id"):
            raise UncertainOutcomeError(
                RUNPOD,
                f"RunPod took the {what} but named none ({error_text(response)}); it may exist as {request.label}",
            )
        return made

    async def members(self, instance_id: str) -> list[ClusterMember]:
        """The pods of a cluster in rank order, each with its private address and SSH address once it has them."""
        path = f"/clusters/{quote(cluster_id_of(instance_id), safe='')}/pods"
        return members_from(checked(await self._api.request("GET", path), "reading the cluster's pods"), ssh_address)

    async def get(self, instance_id: str) -> Instance:
        """The pod (or cluster) now (TERMINATED when RunPod no longer knows it)."""
        if is_cluster_id(instance_id):
            response = await self._api.request("GET", f"/clusters/{quote(cluster_id_of(instance_id), safe='')}")
            if is_missing(response):
                return gone(instance_id)
            return instance_from_cluster(checked(response, f"reading cluster {cluster_id_of(instance_id)}"))
        response = await self._api.request("GET", f"/pods/{quote(instance_id, safe='')}")
        if is_missing(response):
            return gone(instance_id)
        return instance_from(checked(response, f"reading pod {instance_id}"))

    async def stop(self, instance_id: str) -> None:
        """Stops the pod (``EXITED``: its GPU is released, its container disk is kept and bills storage)."""
        path = f"/pods/{quote(instance_id, safe='')}/action"
        checked(await self._api.request("POST", path, json={"action": "stop"}), f"stopping pod {instance_id}")

    async def terminate(self, instance_id: str) -> None:
        """Deletes the pod (``DELETE /pods/{id}``, 204), or a whole cluster (``DELETE /clusters/{id}``: every pod).

        One RunPod no longer knows (404) is already gone.
        """
        what = "clusters" if is_cluster_id(instance_id) else "pods"
        path = f"/{what}/{quote(cluster_id_of(instance_id), safe='')}"
        response = await self._api.request("DELETE", path)
        if response.status_code >= 400 and not is_missing(response):
            words = problem_text(response)
            raise ProviderError(RUNPOD, f"deleting {instance_id} failed ({response.status_code}): {words}", words)

    async def instances(self) -> list[Instance]:
        """Every pod and cluster of the account that could be read (:meth:`listing`, its notes logged)."""
        return logged(await self.listing())

    async def listing(self) -> Listing:
        """Every pod (deleted ones are no longer listed) and every cluster of the account, each list read apart.

        A failed cluster list leaves the pods listed (and the other way round), with a note; a pod or cluster that
        cannot be read is left out alone, named in a note.

        Raises:
            ProviderError: Neither list could be read.
        """
        return await listed_apart(RUNPOD, {"pods": self._pods, "clusters": self._clusters})

    async def _pods(self) -> Listing:
        """Every pod of the account, over every page if RunPod paginates (``GET /pods``)."""
        pods: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            params = {"cursor": cursor} if cursor else None
            body = checked(await self._api.request("GET", "/pods", params=params), "listing pods")
            pods += rows_in(RUNPOD, body, "pods", "listing pods")
            cursor = next_cursor(body)
            if cursor is None or cursor in seen:
                return read_rows(RUNPOD, "pod", pods, instance_from)
            seen.add(cursor)

    async def _clusters(self) -> Listing:
        """Every cluster of the account as one instance each, priced at its pods' cost together.

        A cluster has no price of its own, and its pods are not listed under ``/pods``. A cluster whose pods' cost
        cannot be read is left out alone, named in a note.
        """
        body = checked(await self._api.request("GET", "/clusters"), "listing clusters")
        listing = Listing(RUNPOD)
        for row in rows_in(RUNPOD, body, "clusters", "listing clusters"):
            listing = listing.plus(await self._cluster_row(row))
        return listing

    async def _cluster_row(self, row: Any) -> Listing:
        """One row of the cluster list, priced (or left out, named in a note, when it cannot be read)."""
        try:
            price = await self._cluster_cost(str(row["id"])) if isinstance(row, dict) and row.get("id") else 0.0
        except ProviderError as exc:
            return Listing(RUNPOD, unread=[unread_row(RUNPOD, "cluster", row, f"its pods' cost: {exc.message}")])
        return read_rows(RUNPOD, "cluster", [row], lambda cluster: instance_from_cluster(cluster, price))

    async def _cluster_cost(self, cluster_id: str) -> float:
        """What a cluster's pods cost per hour together (``cost`` of each, as RunPod bills them now)."""
        path = f"/clusters/{quote(cluster_id, safe='')}/pods"
        body = checked(await self._api.request("GET", path), "reading the cluster's pods")
        pods = rows_in(RUNPOD, body, "pods", "reading the cluster's pods")
        costs = [pod.get("cost") for pod in pods if isinstance(pod, dict)]
        return round(sum(float(c) for c in costs if isinstance(c, int | float) and c > 0), 4)

    async def complete_create(self, instance_id: str, request: RentRequest) -> None:
        """Nothing: the create request carried the key and everything else (see :meth:`Provider.complete_create`)."""

    async def named(self, label: str) -> list[Instance]:
        """The pods and clusters named ``label`` that are not gone (v2 has no name filter: both lists are read).

        Found in either list, the machine is found even when the other list failed.

        Raises:
            ProviderError: None was found while a list (or a row) that may hold it could not be read.
        """
        return (await self.listing()).named(label)

    async def aclose(self) -> None:
        """Closes the HTTP clients."""
        await self._api.aclose()
        await self._graphql.aclose()
