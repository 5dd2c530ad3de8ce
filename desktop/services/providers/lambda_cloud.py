"""Lambda Cloud's REST API in Rentune's types: instance types as offers, VMs as instances.

Lambda rents whole VMs (no container image, no spot tier, no stop): a machine is launched into a region with an SSH
key registered on the account beforehand, boots, and is reached as ``ubuntu@<ip>:22``. Success bodies are
``{"data": ...}``; errors ``{"error": {"code", "message", "suggestion"?}}``, whose code and message every
:class:`~.base.ProviderError` raised here keeps.

Launch is never sent twice for one :meth:`LambdaProvider.create`: a retried launch that had in fact succeeded would
leave a second machine billing. Only 429 answers ("not done") are retried; an answer that leaves the outcome unknown
(a 5xx, a timeout) raises :class:`~.base.UncertainOutcomeError`, and the caller looks for a machine with the
request's name (:meth:`LambdaProvider.named`) instead of launching again.

Lambda allows one request a second per key and one launch every 12 seconds (five a minute), and answers 429 beyond
them with no ``Retry-After``: a client's requests are spaced to fit (:class:`Pacer`), and a 429 that still comes is
retried for longer than one launch window (:data:`LAMBDA_RETRY`).

Only the error code ``global/object-does-not-exist`` means a machine is gone: any other 404 (``global/not-found``, an
unknown route: a wrong base URL) is an error. A 403 whose code is not about the key (``global/account-inactive``) is
an account problem, raised with what to fix, not as a refused key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

from desktop.services.providers.base import (
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
    UncertainOutcomeError,
    no_clusters_words,
    offer_matches,
)
from desktop.services.providers.http import ApiClient, RetryPolicy, Sleep
from desktop.services.providers.listing import Listing, logged, read_rows, rows_in

log = logging.getLogger(__name__)

LAMBDA = ProviderName.LAMBDA
INSUFFICIENT_CAPACITY = "instance-operations/launch/insufficient-capacity"
NOT_FOUND = "global/object-does-not-exist"
INVALID_KEY = "global/invalid-api-key"
ACCOUNT_INACTIVE = "global/account-inactive"
KEY_NAME_MAX = 64
CONSOLE = "https://cloud.lambda.ai/instances"
BILLING = "https://cloud.lambda.ai/settings/billing"

#: Lambda's documented limits (Cloud API docs): seconds between two requests with one key, and between two launches.
REQUEST_INTERVAL_S = 1.0
LAUNCH_INTERVAL_S = 12.0
LAUNCH_PATH = "/instance-operations/launch"

#: Retries of a refused request: waits of 1, 2, 4, 8 and 16 s, 31 s in all, outlast a whole 12 s launch window
#: (Lambda says nothing of when to come back; the default policy's 7.5 s in all gave up inside one).
LAMBDA_RETRY = RetryPolicy(attempts=6, first_delay=1.0, factor=2.0)

#: "1x A10 (24 GB PCIe)", "8x Tesla V100 (16 GB)", "8x H100 (80 GB SXM5)": count, model, VRAM, form factor.
DESCRIPTION = re.compile(r"^(\d+)x (?:Tesla )?(.+?) \((\d+) GB(?:\s+([^)]*))?\)")

#: Lambda's statuses (``InstanceStatus`` in its OpenAPI 1.10.0). ``unhealthy`` stays RUNNING: Lambda's health check
#: failed, yet the VM may recover and SSH may still work, so whoever drives the run decides over SSH rather than
#: losing the machine on a provider flag. ``preempted`` is a machine Lambda took back: it never runs again (a wait
#: ends at once), like an outbid spot machine, and is still listed until terminated.
STATES = {
    "booting": InstanceState.STARTING,
    "active": InstanceState.RUNNING,
    "unhealthy": InstanceState.RUNNING,
    "preempted": InstanceState.STOPPED,
    "terminating": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
}

#: Maps (instance id, ip) to where to log in.
SshFor = Callable[[str, str], SshAddress]


def vm_ssh(instance_id: str, ip: str) -> SshAddress:
    """Where every Lambda VM takes SSH: ``ubuntu@<ip>:22`` (the default of ``LambdaProvider(ssh_for=)``)."""
    del instance_id  # the same for every machine
    return SshAddress(ip, 22, "ubuntu")


def parse_description(description: str) -> tuple[int, str, float] | None:
    """GPU count, display name and VRAM per GPU from an instance type's description (None for CPU-only types).

    PCIe is the usual form and is left out of the name ("1x A10 (24 GB PCIe)" is an "A10"); an SXM form factor is
    kept as " SXM", as RunPod and Vast.ai name those boards ("8x H100 (80 GB SXM5)" is an "H100 SXM").
    """
    match = DESCRIPTION.match(description.strip())
    if match is None:
        return None
    count, model, vram, form = match.groups()
    name = f"{model} SXM" if (form or "").upper().startswith("SXM") else model
    return int(count), name, float(vram)


def offers_of_type(type_name: str, entry: dict[str, Any]) -> list[Offer]:
    """One offer per region with capacity (one out-of-stock offer, location "", when no region has any)."""
    spec = entry.get("instance_type") or {}
    parsed = parse_description(str(spec.get("description", "")))
    if parsed is None:
        return []
    count, gpu, vram = parsed
    price = float(spec.get("price_cents_per_hour") or 0) / 100

    def offer(region: str) -> Offer:
        offer_id = f"{type_name}@{region}"
        return Offer(LAMBDA, offer_id, gpu, type_name, count, vram, price, False, None, region, in_stock=bool(region))

    regions = [str(r.get("name", "")) for r in entry.get("regions_with_capacity_available") or []]
    return [offer(region) for region in regions if region] or [offer("")]


def split_offer_id(offer_id: str) -> tuple[str, str]:
    """The instance type and region of an offer id ``<type>@<region>``."""
    type_name, _, region = offer_id.partition("@")
    if not type_name or not region:
        raise NoCapacityError(LAMBDA, f"{offer_id} is not in stock in any region; pick another GPU or try later")
    return type_name, region


def error_parts(response: httpx.Response) -> tuple[str, str]:
    """Lambda's error code and one line of its words: ``message [code]; suggestion``."""
    try:
        body = response.json()
    except ValueError:
        return "", f"HTTP {response.status_code}: {response.text[:200] or response.reason_phrase}"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", f"HTTP {response.status_code}: {str(body)[:200]}"
    code = str(error.get("code") or "")
    text = f"{error.get('message') or 'no message'} [{code or response.status_code}]"
    suggestion = error.get("suggestion")
    return code, f"{text}; {suggestion}" if suggestion else text


def is_not_found(response: httpx.Response) -> bool:
    """Whether the answer says the object does not exist (any more): code ``global/object-does-not-exist`` only.

    Any other 404 (``global/not-found``: no such route, as a wrong base URL gives) is not proof of anything.
    """
    return error_parts(response)[0] == NOT_FOUND


def account_refusal(response: httpx.Response) -> ProviderError | None:
    """The error for a 403 about the account rather than the key (None for any other answer).

    A key Lambda does not accept is ``global/invalid-api-key`` (401, or 403 on some routes): that stays an
    :class:`~.base.AuthError`. ``global/account-inactive`` and other 403 codes are account problems: storing
    another key would not help.
    """
    if response.status_code != 403:
        return None
    code, text = error_parts(response)
    if not code or code == INVALID_KEY:
        return None
    if code == ACCOUNT_INACTIVE:
        return ProviderError(
            LAMBDA,
            f"the Lambda account is inactive ({text}); the API key is fine: verify the account's email address and "
            f"add a valid payment method at {BILLING}, or contact Lambda support, then try again",
            text,
        )
    return ProviderError(LAMBDA, f"Lambda refused the request for this account ({text}); the API key is fine", text)


def data_of(response: httpx.Response, doing: str) -> Any:
    """The ``data`` of a success answer.

    Raises:
        NoCapacityError: Lambda has no capacity for the launch.
        ProviderError: Any other refusal, with Lambda's code and message.
    """
    if response.is_success:
        return response.json().get("data")
    code, text = error_parts(response)
    if code == INSUFFICIENT_CAPACITY:
        raise NoCapacityError(LAMBDA, f"no capacity to {doing}: {text}; pick another region or GPU")
    raise ProviderError(LAMBDA, f"cannot {doing}: {text}", status=response.status_code)


def instance_from(data: dict[str, Any], ssh_for: SshFor) -> Instance:
    """An :class:`Instance` from Lambda's instance object."""
    status = str(data.get("status") or "")
    state = STATES.get(status, InstanceState.STARTING)  # an unknown new status: not yet usable, not gone
    spec = data.get("instance_type") or {}
    parsed = parse_description(str(spec.get("description") or ""))
    ip = data.get("ip")
    instance_id = str(data.get("id"))
    return Instance(
        provider=LAMBDA,
        instance_id=instance_id,
        name=str(data.get("name") or ""),
        state=state,
        price_per_hour=float(spec.get("price_cents_per_hour") or 0) / 100,
        gpu=parsed[1] if parsed else "",
        ssh=ssh_for(instance_id, str(ip)) if state is InstanceState.RUNNING and ip else None,
        status_text=status,
    )


class Pacer:
    """Spaces one client's requests to Lambda's limits (retries included: each is a request).

    Requests go :data:`REQUEST_INTERVAL_S` apart, launches :data:`LAUNCH_INTERVAL_S` apart. Only this client's
    requests are counted: the app drives a run's machines through one client per provider.
    """

    def __init__(
        self,
        request_interval: float = REQUEST_INTERVAL_S,
        launch_interval: float = LAUNCH_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """Creates a pacer.

        Args:
            request_interval: Seconds between two requests.
            launch_interval: Seconds between two launches.
            clock: The time now, in seconds (monotonic).
            sleep: Waits (tests pass one that moves their clock).
        """
        self.request_interval, self.launch_interval = request_interval, launch_interval
        self.clock, self.sleep = clock, sleep
        self._last_request: float | None = None
        self._last_launch: float | None = None
        self._lock = asyncio.Lock()

    def delay(self, launch: bool) -> float:
        """Seconds until a request (a launch, if ``launch``) may go out."""
        due = [] if self._last_request is None else [self._last_request + self.request_interval]
        if launch and self._last_launch is not None:
            due.append(self._last_launch + self.launch_interval)
        now = self.clock()
        return max([0.0, *(moment - now for moment in due)])

    async def wait(self, launch: bool) -> None:
        """Waits until a request (a launch, if ``launch``) may go out, then counts it as sent."""
        async with self._lock:  # requests sent at once go out one by one, each in its turn
            wait = self.delay(launch)
            if wait > 0:
                await self.sleep(wait)
            self._last_request = self.clock()
            if launch:
                self._last_launch = self._last_request


class LambdaApi(ApiClient):
    """:class:`~.http.ApiClient` paced to Lambda's limits (:class:`Pacer`).

    It also tells a 403 about the account from a refused key (:func:`account_refusal`).
    """

    def __init__(
        self,
        api_key: str,
        base_url: str,
        *,
        pacer: Pacer,
        transport: httpx.AsyncBaseTransport | None,
        retry: RetryPolicy,
    ) -> None:
        """Creates the client (its retries wait with the pacer's ``sleep``)."""
        super().__init__(LAMBDA, base_url, api_key, transport=transport, retry=retry, sleep=pacer.sleep)
        self.pacer = pacer

    async def _send(self, method: str, path: str, json: Any, params: Any) -> httpx.Response:
        await self.pacer.wait(launch=method == "POST" and path == LAUNCH_PATH)
        response = await super()._send(method, path, json, params)
        refusal = account_refusal(response)
        if refusal is not None:
            raise refusal
        return response


def gone(instance_id: str) -> Instance:
    """The instance Lambda no longer knows."""
    return Instance(LAMBDA, instance_id, "", InstanceState.TERMINATED, 0.0, status_text="not found")


def key_name(label: str, public_key: str, taken: set[str]) -> str:
    """A key name for ``label`` that is not ``taken`` and fits Lambda's 64 characters."""
    name = f"{label[: KEY_NAME_MAX - 4]}-key"
    if name not in taken:
        return name
    digest = hashlib.sha256(public_key.encode()).hexdigest()[:8]
    return f"{label[: KEY_NAME_MAX - 13]}-key-{digest}"


class LambdaProvider:
    """Lambda Cloud through its REST API (``https://cloud.lambda.ai/api/v1``).

    SSH keys the client registers for a launch are deleted again when that machine is terminated through the same
    client (keys it found already registered are left alone); a key Lambda still counts as in use stays.
    """

    name = ProviderName.LAMBDA

    def __init__(
        self,
        api_key: str,
        base_url: str = "https://cloud.lambda.ai/api/v1",
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
        ssh_for: SshFor = vm_ssh,
        pacer: Pacer | None = None,
    ) -> None:
        """Creates the client.

        Args:
            api_key: The Lambda Cloud API key (sent as Bearer; never logged).
            base_url: The API's root.
            transport: Replaces the network (tests).
            retry: Retry timing for refused requests (:data:`LAMBDA_RETRY` by default).
            ssh_for: Test seam, not for the app: where to log in to a machine given its id and ip. Lambda's VMs
                always take ``ubuntu@<ip>:22`` (:func:`vm_ssh`); the fake cloud's machines are sshd processes on
                random loopback ports, which the Lambda API has no field for.
            pacer: Spaces requests to Lambda's limits (a :class:`Pacer` on the real clock by default; tests pass
                one on theirs).
        """
        self.retry = retry or LAMBDA_RETRY
        self._api = LambdaApi(api_key, base_url, pacer=pacer or Pacer(), transport=transport, retry=self.retry)
        self._ssh_for = ssh_for
        self._registered: set[str] = set()  # ids of keys this client added
        self._key_of: dict[str, str] = {}  # instance id -> id of the key this client added for it
        self._key_of_label: dict[str, str] = {}  # label of a launch of unknown outcome -> the key added for it

    async def check_key(self) -> None:
        """Lists the account's SSH keys (cheap, authenticated).

        Raises:
            AuthError: The key is refused.
            ProviderError: Lambda cannot be reached or failed, or the account is inactive (the message says so).
        """
        data_of(await self._api.request("GET", "/ssh-keys"), "list SSH keys")

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """Instance types matching ``query``, one offer per region with capacity (none for spot: Lambda has none).

        Raises:
            NoClustersError: Several machines were asked for as one cluster: Lambda's API rents none.
        """
        if query.nodes > 1:
            raise NoClustersError(LAMBDA, no_clusters_words(LAMBDA))
        if query.spot:
            return []
        types = data_of(await self._api.request("GET", "/instance-types"), "list instance types") or {}
        found = [offer for name, entry in types.items() for offer in offers_of_type(name, entry)]
        return [offer for offer in found if offer_matches(offer, query)]

    async def create(self, request: RentRequest) -> Instance:
        """Registers the SSH key (once) and launches one machine named ``request.label`` (one request, never repeated).

        Raises:
            NoCapacityError: No capacity for the type in the region.
            UncertainOutcomeError: The launch got a 5xx or no answer: a machine may exist; look it up by label.
            ProviderError: A spot request, or Lambda refused the launch.
        """
        if request.offer.spot or request.bid_per_hour is not None:
            raise ProviderError(LAMBDA, "Lambda has no spot instances; set spot = false")
        type_name, region = split_offer_id(request.offer.offer_id)
        name, key_id = await self._ensure_key(request.label, request.public_key)
        body = {
            "region_name": region,
            "instance_type_name": type_name,
            "ssh_key_names": [name],
            "file_system_names": [],
            "name": request.label,
        }
        try:
            instance_id = await self._launch(body, request)
        except UncertainOutcomeError:
            if key_id in self._registered:  # a machine may use it: deleted with that machine, once named() finds it
                self._key_of_label[request.label] = key_id
            raise
        except ProviderError:
            if key_id in self._registered and not self._key_in_use(key_id):
                await self._delete_key(key_id)
            raise
        if key_id in self._registered:
            self._key_of[instance_id] = key_id
        offer = request.offer
        return Instance(LAMBDA, instance_id, request.label, InstanceState.STARTING, offer.price_per_hour, offer.gpu)

    async def get(self, instance_id: str) -> Instance:
        """The machine now (TERMINATED once Lambda no longer knows it)."""
        response = await self._api.request("GET", f"/instances/{instance_id}")
        if is_not_found(response):
            return gone(instance_id)
        return instance_from(data_of(response, f"read instance {instance_id}"), self._ssh_for)

    async def stop(self, instance_id: str) -> None:
        """Always refuses: Lambda VMs cannot be stopped.

        Raises:
            ProviderError: Always.
        """
        raise ProviderError(LAMBDA, f"Lambda has no stop; terminate instead (instance {instance_id})")

    async def terminate(self, instance_id: str) -> None:
        """Terminates the machine (one already gone is fine), then deletes the key this client added for it."""
        response = await self._api.request(
            "POST", "/instance-operations/terminate", json={"instance_ids": [instance_id]}
        )
        if not is_not_found(response):
            data_of(response, f"terminate instance {instance_id}")
        key_id = self._key_of.pop(instance_id, None)
        if key_id is not None and key_id not in self._key_of.values():
            await self._delete_key(key_id)

    async def instances(self) -> list[Instance]:
        """Every machine of the account that could be read (:meth:`listing`, its notes logged)."""
        return logged(await self.listing())

    async def listing(self) -> Listing:
        """Every machine of the account, terminating and terminated ones included while Lambda lists them.

        A machine that cannot be read is left out alone, named in a note.

        Raises:
            ProviderError: The list could not be read.
        """
        body = {"data": data_of(await self._api.request("GET", "/instances"), "list instances")}
        rows = rows_in(LAMBDA, body, "data", "list instances")
        return read_rows(LAMBDA, "instance", rows, lambda row: instance_from(row, self._ssh_for))

    async def complete_create(self, instance_id: str, request: RentRequest) -> None:
        """Nothing: the create request carried the key and everything else (see :meth:`Provider.complete_create`)."""

    async def named(self, label: str) -> list[Instance]:
        """The machines named ``label`` that are not gone (after a launch whose outcome is unknown).

        A key this client added for a launch of unknown outcome is deleted when the machine found here is
        terminated through this client.

        Raises:
            ProviderError: The list could not be read, or none was found while a machine that may be it could not.
        """
        found = (await self.listing()).named(label)
        key_id = self._key_of_label.get(label)
        if key_id is not None:
            self._key_of.update({instance.instance_id: key_id for instance in found})
        return found

    async def aclose(self) -> None:
        """Closes the HTTP clients."""
        await self._api.aclose()

    # -- keys ----------------------------------------------------------------------------------------------------

    async def _ensure_key(self, label: str, public_key: str) -> tuple[str, str]:
        """The name and id of a registered key equal to ``public_key``, registering it when missing."""
        keys = data_of(await self._api.request("GET", "/ssh-keys"), "list SSH keys") or []
        wanted = public_key.split()[:2]
        for key in keys:
            if str(key.get("public_key", "")).split()[:2] == wanted:
                return str(key["name"]), str(key["id"])
        name = key_name(label, public_key, {str(key.get("name")) for key in keys})
        body = {"name": name, "public_key": public_key.strip()}
        added = data_of(await self._api.request("POST", "/ssh-keys", json=body), f"add SSH key {name}")
        self._registered.add(str(added["id"]))
        return name, str(added["id"])

    def _key_in_use(self, key_id: str) -> bool:
        """Whether a machine launched through this client (or a launch of unknown outcome) uses the key."""
        return key_id in self._key_of.values() or key_id in self._key_of_label.values()

    async def _delete_key(self, key_id: str) -> None:
        """Deletes a key this client added; a key already gone or still in use is left as it is (logged)."""
        self._registered.discard(key_id)
        self._key_of_label = {label: key for label, key in self._key_of_label.items() if key != key_id}
        try:
            response = await self._api.request("DELETE", f"/ssh-keys/{key_id}")
        except ProviderError as exc:  # the machine is what bills; a stray key is only clutter
            log.warning("Lambda SSH key %s not deleted: %s", key_id, exc.message)
            return
        if not response.is_success and not is_not_found(response):
            log.warning("Lambda SSH key %s not deleted: %s", key_id, error_parts(response)[1])

    # -- launch --------------------------------------------------------------------------------------------------

    async def _launch(self, body: dict[str, Any], request: RentRequest) -> str:
        """Sends the launch once (only a 429 is sent again); returns the new instance's id.

        Raises:
            UncertainOutcomeError: A 5xx or no answer: the machine may have launched.
        """
        await request.sending()
        response = await self._api.request("POST", LAUNCH_PATH, json=body, once=True)
        ids = data_of(response, f"launch {body['instance_type_name']} in {body['region_name']}")["instance_ids"]
        return str(ids[0])
