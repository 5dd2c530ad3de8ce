"""Vast.ai's REST API (``/api/v0``) in Rentune's types: search offers, rent, attach the run's key, watch, stop, destroy.

Vast rents containers on other people's machines. A few of its habits shape this module:

- A spot ("bid") instance is one created with a ``price``. A create without it is billed on-demand even when the
  offer came from a bid search, so the price is sent for spot requests only, and a spot request without a bid is
  refused before anything is rented.
- A bid below the machine's minimum still books a stopped instance, named in the error's ``new_contract``; it is
  destroyed before :class:`~.base.BidTooLowError` is raised, so nothing is left billing storage.
- An outbid instance is stopped, not destroyed (``cur_state``, ``intended_status`` and ``next_state`` all
  ``"stopped"``).
- Errors come as ``{"success": false, "error": "<code>", "msg": "..."}``; the ``msg`` is kept in every message.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from desktop.services.providers.base import (
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
from desktop.services.providers.http import ApiClient, RetryPolicy

#: The filters every search sends: machines Vast vouches for, free now, reachable on a direct port, recent CUDA.
BASE_FILTERS: dict[str, dict[str, Any]] = {
    "verified": {"eq": True},
    "external": {"eq": False},
    "rentable": {"eq": True},
    "rented": {"eq": False},
    "direct_port_count": {"gte": 1},
    "cuda_max_good": {"gte": 12.1},
}

#: Where a user destroys an instance by hand.
CONSOLE = "https://cloud.vast.ai/instances/"

#: Run once the container starts: stops Vast's images from wrapping SSH logins in tmux (harmless otherwise).
ONSTART = "touch ~/.no_auto_tmux"

_CAPACITY_WORDS = re.compile(r"no_such_ask|no_such_offer|not available|unavailable|already rented|rented", re.I)
_BID_WORDS = re.compile(r"bid.*\b(low|below|minimum|min_bid|insufficient)|insufficient.*bid|outbid", re.I)
_STOPPED_STATUSES = frozenset({"stopped", "exited", "frozen"})
_STARTING_STATUSES = frozenset({None, "created", "loading", "rebooting", "scheduling"})


class VastProvider:
    """Vast.ai, through its REST API with Bearer auth."""

    name = ProviderName.VAST

    def __init__(
        self,
        api_key: str,
        base_url: str = "https://console.vast.ai/api/v0",
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Creates the client.

        Args:
            api_key: The account's API key (sent as a Bearer token, never logged).
            base_url: The API's root, ending in ``/api/v0``.
            transport: Replaces the network (tests).
            retry: Retry timing for 429 and 5xx answers.
        """
        self._api = ApiClient(self.name, base_url, api_key, transport=transport, retry=retry)

    async def check_key(self) -> None:
        """Reads the account (``GET /users/current/``); a refused key raises :class:`~.base.AuthError`."""
        response = await self._api.request("GET", "/users/current/")
        _checked(response, "could not read the account")

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """Offers matching ``query``, cheapest first (for spot: priced at the lowest winning bid)."""
        response = await self._api.request("POST", "/bundles/", json=search_body(query))
        body = _checked(response, "could not search offers")
        found = [offer_from(row, spot=query.spot) for row in body.get("offers") or []]
        return [offer for offer in found if offer_matches(offer, query)]

    async def create(self, request: RentRequest) -> Instance:
        """Rents the offer, attaches the run's public key, and returns the instance (usually still starting).

        Raises:
            NoCapacityError: The offer is gone or already rented.
            BidTooLowError: The bid is below the machine's minimum (the stopped instance Vast books is destroyed).
            ProviderError: A spot offer without a bid, or any other refusal (nothing is left rented).
        """
        if request.offer.spot and request.bid_per_hour is None:
            raise ProviderError(
                self.name, f"offer {request.offer.offer_id} is a spot offer but no bid was given; set a bid per hour"
            )
        instance_id = await self._rent(request)
        try:
            await self._attach_key(instance_id, request.public_key)
        except BaseException:
            await self._destroy_quietly(instance_id)
            raise
        return await self.get(instance_id)

    async def get(self, instance_id: str) -> Instance:
        """The instance now; TERMINATED when Vast no longer knows it (``null`` or ``no_such_instance``)."""
        response = await self._api.request("GET", f"/instances/{instance_id}/", params={"owner": "me"})
        if _json(response).get("error") == "no_such_instance":
            return _gone(instance_id)
        row = _checked(response, f"could not read instance {instance_id}").get("instances")
        return instance_from(row) if isinstance(row, dict) else _gone(instance_id)

    async def stop(self, instance_id: str) -> None:
        """Stops the instance; its disk stays (and keeps billing storage)."""
        response = await self._api.request("PUT", f"/instances/{instance_id}/", json={"state": "stopped"})
        _checked(response, f"could not stop instance {instance_id}")

    async def terminate(self, instance_id: str) -> None:
        """Destroys the instance; one already gone is fine."""
        response = await self._api.request("DELETE", f"/instances/{instance_id}/")
        if _json(response).get("error") == "no_such_instance":  # a bare 404 (a wrong URL) is not proof it is gone
            return
        _checked(response, f"could not destroy instance {instance_id}", f"destroy it at {CONSOLE}")

    async def instances(self) -> list[Instance]:
        """Every instance of the account."""
        response = await self._api.request("GET", "/instances/", params={"owner": "me"})
        rows = _checked(response, "could not list instances").get("instances") or []
        return [instance_from(row) for row in rows if isinstance(row, dict)]

    async def aclose(self) -> None:
        """Closes the HTTP client."""
        await self._api.aclose()

    # -- renting -------------------------------------------------------------------------------------------------

    async def _rent(self, request: RentRequest) -> str:
        offer_id = request.offer.offer_id
        response = await self._api.request("PUT", f"/asks/{offer_id}/", json=create_body(request))
        body = _json(response)
        if response.status_code < 400 and body.get("success") is not False and body.get("new_contract"):
            return str(body["new_contract"])
        error = create_error(offer_id, response)
        booked = str(body.get("new_contract") or "")  # a refused create may still have booked a (stopped) instance
        if booked and not await self._destroy_quietly(booked):
            raise type(error)(self.name, f"{error.message}; instance {booked} was left: destroy it at {CONSOLE}")
        raise error

    async def _attach_key(self, instance_id: str, public_key: str) -> None:
        response = await self._api.request("POST", f"/instances/{instance_id}/ssh/", json={"ssh_key": public_key})
        _checked(response, f"could not add the run's SSH key to instance {instance_id}", "it was destroyed; try again")

    async def _destroy_quietly(self, instance_id: str) -> bool:
        # Cleanup on a path that already fails: the first error is the one worth raising.
        try:
            await self.terminate(instance_id)
        except ProviderError:
            return False
        return True


def search_body(query: OfferQuery) -> dict[str, Any]:
    """The ``POST /bundles/`` body for ``query`` (the GPU name is matched afterwards, by :func:`offer_matches`)."""
    body: dict[str, Any] = dict(BASE_FILTERS)
    if query.count is not None:
        body["num_gpus"] = {"eq": query.count}
    if query.min_vram_gb is not None:
        # Vast counts MB; 1000 per GB (as vast-cli does) keeps a 24 GB card listed at 24564 MB, checked exactly below.
        body["gpu_ram"] = {"gte": query.min_vram_gb * 1000}
    if query.max_price_per_hour is not None and not query.spot:
        body["dph_total"] = {"lte": query.max_price_per_hour}
    body["order"] = [["dph_total", "asc"]]
    body["type"] = "bid" if query.spot else "on-demand"
    body["limit"] = 200
    body["allocated_storage"] = query.disk_gb
    return body


def offer_from(row: dict[str, Any], *, spot: bool) -> Offer:
    """One Vast offer as an :class:`Offer` (``spot``: priced at ``min_bid``, the lowest bid that wins it now)."""
    reliability = row.get("reliability2", row.get("reliability"))
    price = row.get("min_bid") if spot else row.get("dph_total")
    return Offer(
        provider=ProviderName.VAST,
        offer_id=str(row["id"]),
        gpu=str(row.get("gpu_name") or ""),
        gpu_id=str(row.get("gpu_name") or ""),
        count=int(row.get("num_gpus") or 0),
        vram_gb=round(float(row.get("gpu_ram") or 0) / 1024, 1),
        price_per_hour=float(price or 0.0),
        spot=spot,
        reliability=None if reliability is None else float(reliability),
        location=str(row.get("geolocation") or ""),
        in_stock=bool(row.get("rentable", True)) and not row.get("rented", False),
    )


def create_body(request: RentRequest) -> dict[str, Any]:
    """The ``PUT /asks/{id}/`` body; ``price`` only for a spot offer (its presence is what makes a bid)."""
    body: dict[str, Any] = {
        "client_id": "me",
        "image": request.image,
        "disk": request.disk_gb,
        "label": request.label,
        "runtype": "ssh_direc ssh_proxy",
        "env": {},
        "onstart": ONSTART,
    }
    if request.offer.spot and request.bid_per_hour is not None:
        body["price"] = request.bid_per_hour
    return body


def create_error(offer_id: str, response: httpx.Response) -> ProviderError:
    """The error for a refused create: out of stock, a bid too low, or anything else, with Vast's own words."""
    body = _json(response)
    code, words = str(body.get("error") or ""), _message(response)
    if _BID_WORDS.search(f"{code} {words}"):
        return BidTooLowError(ProviderName.VAST, f"bid too low for offer {offer_id}: {words}; raise the bid")
    if _CAPACITY_WORDS.search(f"{code} {words}"):
        return NoCapacityError(ProviderName.VAST, f"offer {offer_id} is no longer available: {words}; pick another")
    return ProviderError(ProviderName.VAST, f"could not rent offer {offer_id}: {words}")


def instance_from(row: dict[str, Any]) -> Instance:
    """One Vast instance as an :class:`Instance`."""
    state = instance_state(row)
    return Instance(
        provider=ProviderName.VAST,
        instance_id=str(row["id"]),
        name=str(row.get("label") or ""),
        state=state,
        price_per_hour=float(row.get("dph_total") or 0.0),
        gpu=str(row.get("gpu_name") or ""),
        spot=bool(row.get("is_bid")),
        ssh=ssh_address(row) if state is InstanceState.RUNNING else None,
        status_text=_status_text(row),
    )


def instance_state(row: dict[str, Any]) -> InstanceState:
    """Vast's statuses in Rentune's words.

    A container that failed to start (``OCI runtime create failed``) is FAILED. Outbid or stopped instances are
    STOPPED. A host that is ``offline`` or ``unknown`` is STARTING while Vast still intends it to run (it may come
    back; the caller's readiness timeout decides when to give up, with Vast's words in ``status_text``), else STOPPED.
    """
    actual, intended = row.get("actual_status"), row.get("intended_status")
    if "OCI runtime create failed" in str(row.get("status_msg") or ""):
        return InstanceState.FAILED
    if row.get("cur_state") == intended == row.get("next_state") == "stopped":  # outbid, or stopped by the user
        return InstanceState.STOPPED
    if actual in _STOPPED_STATUSES or intended == "stopped":
        return InstanceState.STOPPED
    if actual == "running":
        return InstanceState.RUNNING
    return InstanceState.STARTING if actual in _STARTING_STATUSES or intended == "running" else InstanceState.STOPPED


def ssh_address(row: dict[str, Any]) -> SshAddress | None:
    """The direct port mapped to the container's 22 (``HostPort`` is a string), else Vast's SSH proxy."""
    mapped = (row.get("ports") or {}).get("22/tcp") or []
    if mapped and row.get("public_ipaddr"):
        return SshAddress(str(row["public_ipaddr"]).strip(), int(mapped[0]["HostPort"]), "root")
    if row.get("ssh_host") and row.get("ssh_port"):
        return SshAddress(str(row["ssh_host"]), int(row["ssh_port"]), "root")
    return None


def _status_text(row: dict[str, Any]) -> str:
    status = str(row.get("actual_status") or "provisioning")
    message = str(row.get("status_msg") or "").strip()
    return f"{status}: {message}" if message else status


def _gone(instance_id: str) -> Instance:
    return Instance(ProviderName.VAST, instance_id, "", InstanceState.TERMINATED, 0.0, status_text="destroyed")


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _message(response: httpx.Response) -> str:
    body = _json(response)
    words = body.get("msg") or body.get("message") or body.get("error")
    return str(words) if words else f"HTTP {response.status_code} {response.reason_phrase}".strip()


def _checked(response: httpx.Response, doing: str, fix: str = "") -> dict[str, Any]:
    """The JSON body of a successful answer; a 4xx or ``success: false`` raises with Vast's message (and the fix)."""
    body = _json(response)
    if response.status_code >= 400 or body.get("success") is False:
        raise ProviderError(ProviderName.VAST, f"{doing}: {_message(response)}" + (f"; {fix}" if fix else ""))
    return body
