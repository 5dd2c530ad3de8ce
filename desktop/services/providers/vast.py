"""Vast.ai's REST API in Rentune's types: search offers, rent, attach the run's key, watch, stop, destroy.

Vast rents containers on other people's machines. A few of its habits shape this module:

- The API lives under ``/api/v0`` (the client's base URL), except the instance list: ``/api/v0/instances/`` is
  deprecated for ``/api/v1/instances/``, which answers at most 25 per page and a ``next_token`` for the next one.
  Every page is read, or machines (and orphans) go unseen.
- A create (``PUT /asks/{id}/``) is sent once: Vast may rent a machine for a request whose answer never came, so a
  5xx or a timeout raises :class:`~.base.UncertainOutcomeError` and the caller looks the machine up by its label
  (:meth:`VastProvider.named`) instead of renting again.
- A spot ("bid") instance is one created with a ``price``. A create without it is billed on-demand even when the
  offer came from a bid search, so the price is sent for spot requests only, and a spot request without a bid is
  refused before anything is rented.
- The provider never destroys a machine on its own: a create that fails after Vast booked an instance (a bid below
  the minimum books a stopped one, named in the error's ``new_contract``; a key Vast refuses to attach) raises with
  the machine's ``instance_id``, and the caller records it and destroys it until it is gone.
- Offers are priced as they bill: ``dph_total`` (the search's ``allocated_storage`` included) on-demand, and the
  bid plus the same storage for spot, since ``min_bid`` leaves the disk out (:func:`offer_from`); the bid sent to
  Vast is the machine's part alone.
- ``gpu_ram`` is in MiB, less what the driver and ECC reserve (an 80 GB H100 reads 81559): VRAM is compared in MiB
  with a tolerance, and offers show the card's nominal size (:func:`nominal_vram_gb`).
- An outbid instance is stopped, not destroyed (``cur_state``, ``intended_status`` and ``next_state`` all
  ``"stopped"``); ``exited``, ``unknown`` and ``offline`` never reach running (FAILED: stop waiting, destroy).
- A DELETE of an instance Vast no longer has answers 404 ``not_found`` (older answers: ``no_such_instance``): gone,
  which is what a destroy wants. ``not_found`` is also what any unknown path may answer, so it is believed once
  Vast's view of the instance agrees (a wrong base URL never passes for a destroyed machine).
- Errors come as ``{"success": false, "error": "<code>", "msg": "..."}`` (429s as ``{"detail": ...}`` or plain
  text); Vast's words are kept in every message.
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
    NoClustersError,
    Offer,
    OfferQuery,
    ProviderError,
    ProviderName,
    RentRequest,
    SshAddress,
    no_clusters_words,
    offer_matches,
)
from desktop.services.providers.http import ApiClient, RetryPolicy
from desktop.services.providers.listing import Listing, logged, read_rows, rows_in

VAST = ProviderName.VAST

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

#: Seconds a create may take before its outcome counts as unknown (vast-cli allows 120: creation is slow).
CREATE_TIMEOUT = 120.0

#: Instances per page of ``/api/v1/instances/`` (Vast's maximum).
PAGE_SIZE = 25

#: Pages read at most before a list is given up (a ``next_token`` that never ends).
MAX_PAGES = 400

#: Share of a card's memory Vast may report missing (driver and ECC reservations: an L40S, 48 GB, reads 46068 MiB).
VRAM_TOLERANCE = 0.08

#: Hours in the month of ``storage_cost`` ($ per GB per month), as gpuhunt and dstack count it.
HOURS_PER_MONTH = 30 * 24

#: Marketed memory sizes of GPUs, GB: what an offer shows when its ``gpu_ram`` is one of them less the reservations.
NOMINAL_VRAM_GB = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 180, 192, 288)

_CAPACITY_WORDS = re.compile(r"no_such_ask|no_such_offer|not available|unavailable|already rented|rented", re.I)
_BID_WORDS = re.compile(r"bid.*\b(low|below|minimum|min_bid|insufficient)|insufficient.*bid|outbid", re.I)
_API_VERSION = re.compile(r"/api/v\d+$")

#: ``actual_status`` values, in Rentune's words (an ``intended_status`` of ``stopped`` overrides them: see
#: :func:`instance_state`). ``exited``, ``unknown`` and ``offline`` never reach running (Vast's docs): FAILED ends
#: the wait at once, instead of waiting out the timeout while storage bills.
ACTUAL_STATES: dict[str | None, InstanceState] = {
    None: InstanceState.STARTING,  # provisioning
    "scheduling": InstanceState.STARTING,
    "created": InstanceState.STARTING,
    "loading": InstanceState.STARTING,
    "rebooting": InstanceState.STARTING,
    "running": InstanceState.RUNNING,
    "stopped": InstanceState.STOPPED,
    "frozen": InstanceState.STOPPED,
    "exited": InstanceState.FAILED,
    "unknown": InstanceState.FAILED,
    "offline": InstanceState.FAILED,
}


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
            base_url: The API's root, ending in ``/api/v0`` (the instance list goes to ``/api/v1`` on the same host).
            transport: Replaces the network (tests).
            retry: Retry timing for 429 and 5xx answers.
        """
        self._api = ApiClient(self.name, base_url, api_key, transport=transport, retry=retry)
        self._creates = ApiClient(
            self.name, base_url, api_key, transport=transport, retry=retry, timeout=CREATE_TIMEOUT
        )
        self._v1 = v1_url(base_url)

    async def check_key(self) -> None:
        """Reads the account (``GET /users/current/``); a refused key raises :class:`~.base.AuthError`."""
        response = await self._api.request("GET", "/users/current/")
        _checked(response, "could not read the account")

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """Offers matching ``query``, cheapest first (for spot: priced at the lowest winning bid).

        Raises:
            NoClustersError: Several machines were asked for as one cluster: Vast.ai rents none.
        """
        if query.nodes > 1:
            raise NoClustersError(VAST, no_clusters_words(VAST))
        response = await self._api.request("POST", "/bundles/", json=search_body(query))
        body = _checked(response, "could not search offers")
        found = [offer_from(row, spot=query.spot, disk_gb=query.disk_gb) for row in body.get("offers") or []]
        return [offer for offer in found if offer_matches(offer, query)]

    async def create(self, request: RentRequest) -> Instance:
        """Rents the offer (one request, never repeated), attaches the run's public key, returns the instance.

        Raises:
            NoCapacityError: The offer is gone or already rented.
            BidTooLowError: The bid is below the machine's minimum (``instance_id``: the stopped instance Vast booked).
            UncertainOutcomeError: The create got a 5xx or no answer: a machine may exist; look it up by label.
            ProviderError: A spot offer without a bid, a key Vast would not attach (``instance_id``: the machine,
                left for the caller to destroy), or any other refusal.
        """
        if request.offer.spot and request.bid_per_hour is None:
            raise ProviderError(
                self.name, f"offer {request.offer.offer_id} is a spot offer but no bid was given; set a bid per hour"
            )
        instance_id = await self._rent(request)
        try:
            await self._attach_key(instance_id, request.public_key)
        except ProviderError as exc:
            raise ProviderError(
                self.name,
                f"could not add the run's SSH key to instance {instance_id}: {exc.message}; the instance is "
                "still rented: terminate it",
                exc.reason,
                instance_id=instance_id,
            ) from exc
        return await self.get(instance_id)

    async def complete_create(self, instance_id: str, request: RentRequest) -> None:
        """Attaches the run's key to an instance found by its label: the create's answer was lost before it was.

        Raises:
            ProviderError: Vast would not attach it (the instance stays rented: terminate it).
        """
        await self._attach_key(instance_id, request.public_key)

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
        """Destroys the instance; one already gone is fine.

        Gone is ``no_such_instance``, or a 404 ``not_found`` that a look at the instance confirms.
        """
        response = await self._api.request("DELETE", f"/instances/{instance_id}/")
        code = _json(response).get("error")
        if code == "no_such_instance":  # a bare 404 (a wrong URL) is not proof it is gone
            return
        if response.status_code == 404 and code == "not_found" and await self._confirmed_gone(instance_id):
            return
        _checked(response, f"could not destroy instance {instance_id}", f"destroy it at {CONSOLE}")

    async def _confirmed_gone(self, instance_id: str) -> bool:
        """Whether Vast's view of the instance says it is gone (False when it cannot be read: a wrong URL)."""
        try:
            return (await self.get(instance_id)).state is InstanceState.TERMINATED
        except ProviderError:
            return False

    async def instances(self) -> list[Instance]:
        """Every instance of the account that could be read (:meth:`listing`, its notes logged)."""
        return logged(await self.listing())

    async def listing(self) -> Listing:
        """Every instance of the account: every page of ``/api/v1/instances/``.

        An instance that cannot be read (a ``HostPort`` that is no number) is left out alone, named in a note.

        Raises:
            ProviderError: A page could not be read, or the pages never end.
        """
        rows: list[Any] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page, token = await self._page(token)
            rows += page
            if token is None:
                return read_rows(VAST, "instance", rows, instance_from, name_key="label")
        raise ProviderError(self.name, f"the instance list did not end after {MAX_PAGES} pages; try again later")

    async def named(self, label: str) -> list[Instance]:
        """The instances labelled ``label`` that are not destroyed (after a create whose outcome is unknown).

        Raises:
            ProviderError: The list could not be read, or none was found while an instance that may be it could not.
        """
        return (await self.listing()).named(label)

    async def aclose(self) -> None:
        """Closes the HTTP clients."""
        await self._api.aclose()
        await self._creates.aclose()

    # -- listing -------------------------------------------------------------------------------------------------

    async def _page(self, token: str | None) -> tuple[list[Any], str | None]:
        """One page of the v1 list and the token of the next (None on the last page)."""
        params: dict[str, Any] = {"limit": PAGE_SIZE}
        if token is not None:
            params["after_token"] = token
        response = await self._api.request("GET", f"{self._v1}/instances/", params=params)
        body = _checked(response, "could not list instances")
        rows = rows_in(VAST, body, "instances", "could not list instances")
        following = body.get("next_token")
        return rows, (str(following) if following and rows and following != token else None)

    # -- renting -------------------------------------------------------------------------------------------------

    async def _rent(self, request: RentRequest) -> str:
        offer_id = request.offer.offer_id
        await request.sending()
        response = await self._creates.request("PUT", f"/asks/{offer_id}/", json=create_body(request), once=True)
        body = _json(response)
        if response.status_code < 400 and body.get("success") is not False and body.get("new_contract"):
            return str(body["new_contract"])
        error = create_error(offer_id, response)
        booked = str(body.get("new_contract") or "")  # a refused create may still have booked a (stopped) instance
        if booked:
            raise type(error)(
                self.name, f"{error.message}; instance {booked} was booked anyway", error.reason, instance_id=booked
            )
        raise error

    async def _attach_key(self, instance_id: str, public_key: str) -> None:
        response = await self._api.request("POST", f"/instances/{instance_id}/ssh/", json={"ssh_key": public_key})
        _checked(response, "Vast refused the key")


def v1_url(base_url: str) -> str:
    """The ``/api/v1`` root on the host of ``base_url`` (an ``/api/v0`` root, as ``RENTUNE_VAST_URL`` gives)."""
    root = base_url.rstrip("/")
    return _API_VERSION.sub("/api/v1", root) if _API_VERSION.search(root) else f"{root}/api/v1"


def mib_for_gb(gb: float) -> int:
    """The least ``gpu_ram`` (MiB, as Vast counts) a card sold as ``gb`` GB may report (with the reservations)."""
    return int(gb * 1024 * (1 - VRAM_TOLERANCE))


def nominal_vram_gb(mib: float) -> float:
    """A card's memory as it is sold, GB, from Vast's ``gpu_ram`` in MiB.

    Vast reports what the driver leaves free: 81559 MiB for an 80 GB H100, 46068 for a 48 GB L40S, 24564 for a
    24 GB RTX 4090. The smallest marketed size that this is at most 2 % above and at most 8 % below is the answer;
    memory that fits none is given in GiB, to a tenth.
    """
    gib = mib / 1024
    for size in NOMINAL_VRAM_GB:
        if size * (1 - VRAM_TOLERANCE) <= gib <= size * 1.02:
            return float(size)
    return round(gib, 1)


def search_body(query: OfferQuery) -> dict[str, Any]:
    """The ``POST /bundles/`` body for ``query`` (the GPU name is matched afterwards, by :func:`offer_matches`)."""
    body: dict[str, Any] = dict(BASE_FILTERS)
    if query.count is not None:
        body["num_gpus"] = {"eq": query.count}
    if query.min_vram_gb is not None:
        body["gpu_ram"] = {"gte": mib_for_gb(query.min_vram_gb)}  # MiB, less the reservations: an H100 passes 80 GB
    if query.max_price_per_hour is not None and not query.spot:
        body["dph_total"] = {"lte": query.max_price_per_hour}
    body["order"] = [["dph_total", "asc"]]
    body["type"] = "bid" if query.spot else "on-demand"
    body["limit"] = 200
    body["allocated_storage"] = query.disk_gb
    return body


def storage_per_hour(row: dict[str, Any], disk_gb: float) -> float:
    """What ``disk_gb`` GB of the offer's disk bill per hour (``storage_cost`` is dollars per GB per month)."""
    return float(row.get("storage_cost") or 0.0) * disk_gb / HOURS_PER_MONTH


def machine_price(row: dict[str, Any], *, spot: bool, storage: float) -> float:
    """The offer's price as it bills, ``storage`` (per hour) included on either basis.

    On-demand: ``dph_total``, Vast's own sum of ``dph_base`` and the searched disk (else the two added here).
    Spot: ``min_bid``, the lowest bid that wins the machine now, which leaves the disk out, plus ``storage``.
    """
    if spot:
        return float(row.get("min_bid") or 0.0) + storage
    total = row.get("dph_total")
    return float(total) if total is not None else float(row.get("dph_base") or 0.0) + storage


def offer_from(row: dict[str, Any], *, spot: bool, disk_gb: float = 0.0) -> Offer:
    """One Vast offer as an :class:`Offer`, priced as it bills with ``disk_gb`` of disk (:func:`machine_price`)."""
    reliability = row.get("reliability2", row.get("reliability"))
    storage = storage_per_hour(row, disk_gb)
    return Offer(
        provider=VAST,
        offer_id=str(row["id"]),
        gpu=str(row.get("gpu_name") or ""),
        gpu_id=str(row.get("gpu_name") or ""),
        count=int(row.get("num_gpus") or 0),
        vram_gb=nominal_vram_gb(float(row.get("gpu_ram") or 0)),
        price_per_hour=round(machine_price(row, spot=spot, storage=storage), 6),
        spot=spot,
        reliability=None if reliability is None else float(reliability),
        location=str(row.get("geolocation") or ""),
        in_stock=bool(row.get("rentable", True)) and not row.get("rented", False),
        storage_per_hour=round(storage, 6),
    )


def create_body(request: RentRequest) -> dict[str, Any]:
    """The ``PUT /asks/{id}/`` body; ``price`` only for a spot offer (its presence is what makes a bid).

    The bid is the machine's part alone (``bid_per_hour``): Vast bills the disk on top of it.
    """
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
        return BidTooLowError(VAST, f"bid too low for offer {offer_id}: {words}; raise the bid", words)
    if _CAPACITY_WORDS.search(f"{code} {words}"):
        return NoCapacityError(VAST, f"offer {offer_id} is no longer available: {words}; pick another", words)
    return ProviderError(VAST, f"could not rent offer {offer_id}: {words}", words)


def instance_from(row: dict[str, Any]) -> Instance:
    """One Vast instance as an :class:`Instance` (``created_at`` from ``start_date``, epoch seconds).

    ``ended_at`` stays None: Vast lists no destroyed instances, and its ``end_date`` is when the host's offer
    expires, not when billing stopped.
    """
    state = instance_state(row)
    return Instance(
        provider=VAST,
        instance_id=str(row["id"]),
        name=str(row.get("label") or ""),
        state=state,
        price_per_hour=float(row.get("dph_total") or 0.0),
        gpu=str(row.get("gpu_name") or ""),
        spot=bool(row.get("is_bid")),
        ssh=ssh_address(row) if state is InstanceState.RUNNING else None,
        status_text=_status_text(row),
        created_at=_epoch(row.get("start_date")),
    )


def instance_state(row: dict[str, Any]) -> InstanceState:
    """Vast's statuses in Rentune's words.

    A container that failed to start (``OCI runtime create failed``) is FAILED. An instance Vast means to keep
    stopped (outbid, or stopped by the user; its ``actual_status`` then reads ``exited`` or ``stopped``) is
    STOPPED: its disk is still there and bills. Otherwise ``actual_status`` decides (:data:`ACTUAL_STATES`); a
    value Vast adds later is STARTING while Vast intends the instance to run (the caller's readiness timeout
    decides, with Vast's words in ``status_text``), else STOPPED.
    """
    actual, intended = row.get("actual_status"), row.get("intended_status")
    if "OCI runtime create failed" in str(row.get("status_msg") or ""):
        return InstanceState.FAILED
    if intended == "stopped":  # outbid: cur_state, intended_status and next_state all "stopped"
        return InstanceState.STOPPED
    if actual in ACTUAL_STATES:
        return ACTUAL_STATES[actual]
    return InstanceState.STARTING if intended == "running" else InstanceState.STOPPED


def ssh_address(row: dict[str, Any]) -> SshAddress | None:
    """The direct port mapped to the container's 22 (``HostPort`` is a string), else Vast's SSH proxy."""
    mapped = (row.get("ports") or {}).get("22/tcp") or []
    if mapped and row.get("public_ipaddr"):
        return SshAddress(str(row["public_ipaddr"]).strip(), int(mapped[0]["HostPort"]), "root")
    if row.get("ssh_host") and row.get("ssh_port"):
        return SshAddress(str(row["ssh_host"]), int(row["ssh_port"]), "root")
    return None


def _epoch(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def _status_text(row: dict[str, Any]) -> str:
    status = str(row.get("actual_status") or "provisioning")
    message = str(row.get("status_msg") or "").strip()
    return f"{status}: {message}" if message else status


def _gone(instance_id: str) -> Instance:
    return Instance(VAST, instance_id, "", InstanceState.TERMINATED, 0.0, status_text="destroyed")


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _message(response: httpx.Response) -> str:
    body = _json(response)
    words = body.get("msg") or body.get("message") or body.get("detail") or body.get("error")
    if words:
        return str(words)
    text = "" if body else response.text.strip()[:300]  # a plain-text body (Vast's 429s may be one)
    return text or f"HTTP {response.status_code} {response.reason_phrase}".strip()


def _checked(response: httpx.Response, doing: str, fix: str = "") -> dict[str, Any]:
    """The JSON body of a successful answer; a 4xx or ``success: false`` raises with Vast's message (and the fix)."""
    body = _json(response)
    if response.status_code >= 400 or body.get("success") is False:
        words = _message(response)
        raise ProviderError(VAST, f"{doing}: {words}" + (f"; {fix}" if fix else ""), words, status=response.status_code)
    return body
