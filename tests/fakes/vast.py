"""A fake Vast.ai REST API (``/api/v0``, and ``/api/v1`` for the instance list), following the shapes in
``shared/reference/providers.md`` section 2 and its December 2026 corrections.

- ``POST /bundles/`` evaluates the ``{field: {op: value}}`` filters for real (an unknown field is a 400), orders,
  limits and answers ``{"offers": [...]}``.
- ``PUT /asks/{id}/`` books an instance; with ``price`` it is a bid, without it it bills on-demand even if the
  search was for bids (the book keeps ``extra["price"]`` so a test sees what was sent). A bid below ``min_bid`` (or
  the ``bid_too_low`` fault) books a *stopped* instance and answers an error that still names ``new_contract``.
- ``POST /instances/{id}/ssh/`` attaches a key. The machine boots only once a key is attached.
- ``GET /instances/{id}/`` answers ``{"instances": {...} | null}``; ``actual_status`` moves null → loading →
  running; ``ports["22/tcp"][0]["HostPort"]`` is a string; outbid instances are ``stopped`` with ``cur_state``,
  ``intended_status`` and ``next_state`` all ``"stopped"``; a host lost with :meth:`FakeVast.lose_host` reads
  ``exited``, ``unknown`` or ``offline`` while Vast still intends it to run.
- ``GET /api/v1/instances/?limit=&after_token=`` lists ``page_size`` (at most 25) instances a page, with a
  ``next_token`` while more follow; the deprecated ``GET /api/v0/instances/`` still answers them all at once.
- Prices as Vast bills: an offer's ``dph_total`` is ``dph_base`` plus its disk (``storage_cost`` dollars per GB per
  month, 30-day months, for the search's ``allocated_storage``); ``min_bid`` leaves the disk out. An instance bills
  ``dph_base``, or its bid, plus the disk it was created with (its row's ``dph_total``).
- ``gpu_ram`` is in MiB (an 80 GB H100 reads 81559); 429s are ``{"detail": ...}`` without ``Retry-After``.
- ``DELETE /instances/{id}/`` of an instance it does not have (never, or no longer) is 404 ``not_found``.
- :meth:`FakeVast.billed_seconds` is what Vast would bill an instance for: from its create to its destroy.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

from tests.fakes.http import FakeCloud, FakeInstance, FakeRequest, FakeResponse

PREFIX = "/api/v0"
V1_PREFIX = "/api/v1"
#: Vast's most instances per page of the v1 list.
MAX_PAGE = 25

OFFERS: list[dict[str, Any]] = [
    {
        "id": 5001, "machine_id": 301, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564,
        "dph_base": 0.39, "storage_cost": 0.144,
        "min_bid": 0.18, "reliability2": 0.99, "reliability": 0.99, "geolocation": "Oslo, NO",
        "verified": True, "external": False, "rentable": True, "rented": False, "direct_port_count": 20,
        "cuda_max_good": 12.4, "is_bid": False, "public_ipaddr": "127.0.0.1",
    },
    {
        "id": 5002, "machine_id": 302, "gpu_name": "RTX 3090", "num_gpus": 2, "gpu_ram": 24576,
        "dph_base": 0.51, "storage_cost": 0.144,
        "min_bid": 0.25, "reliability2": 0.97, "reliability": 0.97, "geolocation": "Texas, US",
        "verified": True, "external": False, "rentable": True, "rented": False, "direct_port_count": 8,
        "cuda_max_good": 12.2, "is_bid": False, "public_ipaddr": "127.0.0.1",
    },
    {
        "id": 5003, "machine_id": 303, "gpu_name": "A100 SXM4", "num_gpus": 1, "gpu_ram": 81920,
        "dph_base": 1.09, "storage_cost": 0.144,
        "min_bid": 0.61, "reliability2": 0.81, "reliability": 0.81, "geolocation": None,
        "verified": True, "external": False, "rentable": True, "rented": False, "direct_port_count": 4,
        "cuda_max_good": 12.8, "is_bid": False, "public_ipaddr": "127.0.0.1",
    },
    # Never listed by a search with the usual filters: unverified, and too old a CUDA.
    {
        "id": 5004, "machine_id": 304, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564,
        "dph_base": 0.2, "storage_cost": 0.144,
        "min_bid": 0.10, "reliability2": 0.90, "reliability": 0.90, "geolocation": "Lagos, NG",
        "verified": False, "external": False, "rentable": True, "rented": False, "direct_port_count": 2,
        "cuda_max_good": 12.4, "is_bid": False, "public_ipaddr": "127.0.0.1",
    },
    {
        "id": 5005, "machine_id": 305, "gpu_name": "H100 SXM", "num_gpus": 1, "gpu_ram": 81559,
        "dph_base": 1.89, "storage_cost": 0.144,
        "min_bid": 1.20, "reliability2": 0.995, "reliability": 0.995, "geolocation": "Paris, FR",
        "verified": True, "external": False, "rentable": True, "rented": False, "direct_port_count": 10,
        "cuda_max_good": 11.8, "is_bid": False, "public_ipaddr": "127.0.0.1",
    },
]  # fmt: skip

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "gt": lambda a, b: a is not None and a > b,
    "gte": lambda a, b: a is not None and a >= b,
    "lt": lambda a, b: a is not None and a < b,
    "lte": lambda a, b: a is not None and a <= b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}
_SEARCH_KEYS = {"order", "type", "limit", "allocated_storage"}
#: Vast's default ``allocated_storage`` for pricing a search, GB (vast-cli's ``--storage``).
DEFAULT_STORAGE_GB = 5.0


def storage_per_hour(offer: dict[str, Any], disk_gb: float) -> float:
    """What ``disk_gb`` GB of the offer's disk bill per hour (``storage_cost``: dollars per GB per 30-day month)."""
    return float(offer["storage_cost"]) * disk_gb / (30 * 24)


def priced(offer: dict[str, Any], disk_gb: float) -> dict[str, Any]:
    """The offer as a search answers it: ``dph_total`` is ``dph_base`` plus ``disk_gb`` of its disk."""
    return {**offer, "dph_total": round(offer["dph_base"] + storage_per_hour(offer, disk_gb), 6)}


def _error(status: int, code: str, msg: str, **more: Any) -> FakeResponse:
    return FakeResponse(status, {"success": False, "error": code, "msg": msg, **more})


class FakeVast(FakeCloud):
    """Vast.ai, answering under ``/api/v0`` (give the client ``<served URL>/api/v0``).

    Attributes:
        offers: The offers it sells (a test may edit them).
        direct_ports: Whether machines publish a direct port for 22 (False: only Vast's SSH proxy reaches them).
        page_size: Instances per page of the v1 list (Vast's 25; a test may lower it to see pages followed).
    """

    def __init__(self, root: Path, *, boot_seconds: float = 1.0) -> None:
        super().__init__(root, boot_seconds=boot_seconds)
        self.offers = [dict(offer) for offer in OFFERS]
        self.direct_ports = True
        self.page_size = MAX_PAGE

    def dispatch(self, request: FakeRequest) -> FakeResponse:
        """As the base class, but a 429 is worded as Vast words it: ``{"detail": ...}``, no ``Retry-After``."""
        reply = super().dispatch(request)
        if reply.status == 429:
            return FakeResponse(429, {"detail": "API requests too frequent endpoint threshold=4.0"})
        return reply

    billing_start_key = "booked_at"  # billing starts at the booking, not at a restart

    def lose_host(self, instance_id: str, status: str = "offline") -> None:
        """The instance's host goes ``offline`` (or ``unknown``, or the container ``exited``): it never runs again."""
        with self.lock:
            instance = self.instances[instance_id]
            instance.extra["host_status"] = status
            self.pool.kill(instance.id)
            instance.address = None
            self.save()

    def refresh(self, instance: FakeInstance) -> FakeInstance:
        """As the base class, but a machine boots only once a key is attached (Vast attaches it after create), and
        never on a lost host."""
        if (not instance.public_key and instance.running_since is None) or "host_status" in instance.extra:
            return instance
        return super().refresh(instance)

    # -- routing -------------------------------------------------------------------------------------------------

    def handle(self, request: FakeRequest) -> FakeResponse:
        """Answers one request of the v0 API."""
        scoped = self._instance_scope(request)
        if (request.bearer != self.valid_key and not scoped) or self.faults.reject_key:
            return _error(401, "auth_error", "Invalid user key")
        if request.method == "GET" and re.fullmatch(f"{V1_PREFIX}/instances/?", request.path):
            return self._list_v1(request)
        if not request.path.startswith(PREFIX):
            return _error(404, "not_found", f"no route {request.path}")
        path = request.path[len(PREFIX) :]
        routes: list[tuple[str, str, Callable[..., FakeResponse]]] = [
            ("POST", r"/bundles/", self._search),
            ("PUT", r"/asks/(\d+)/", self._create),
            ("POST", r"/instances/(\d+)/ssh/", self._attach_key),
            ("GET", r"/instances/(\d+)/", self._show),
            ("PUT", r"/instances/(\d+)/", self._change),
            ("DELETE", r"/instances/(\d+)/", self._destroy),
            ("GET", r"/instances/", self._list),
            ("GET", r"/users/current/", self._user),
        ]
        for method, pattern, answer in routes:
            match = re.fullmatch(pattern, path)
            if match and method == request.method:
                return answer(request, *match.groups())
        return _error(404, "not_found", f"no route {request.method} {path}")

    def is_terminate(self, request: FakeRequest) -> bool:
        """``DELETE /instances/{id}/`` destroys an instance."""
        return request.method == "DELETE" and re.search(r"/instances/\d+/?$", request.path) is not None

    def is_create(self, request: FakeRequest) -> bool:
        """``PUT /asks/{offer}/`` rents an offer."""
        return request.method == "PUT" and re.search(r"/asks/\d+/?$", request.path) is not None

    def _instance_scope(self, request: FakeRequest) -> bool:
        """Whether an instance's own key (``CONTAINER_API_KEY`` inside it) stops or destroys that very instance."""
        bearer = request.bearer or ""
        instance_id = bearer.removeprefix("instance-scoped-")
        own = f"{PREFIX}/instances/{instance_id}/"
        return bearer.startswith("instance-scoped-") and request.path == own and request.method in ("PUT", "DELETE")

    # -- offers --------------------------------------------------------------------------------------------------

    def _search(self, request: FakeRequest) -> FakeResponse:
        body = request.json() or {}
        if body.get("type") not in ("on-demand", "bid"):
            return _error(400, "invalid_args", f"type must be on-demand or bid, not {body.get('type')!r}")
        filters = {key: value for key, value in body.items() if key not in _SEARCH_KEYS}
        offers = [priced(offer, float(body.get("allocated_storage") or DEFAULT_STORAGE_GB)) for offer in self.offers]
        unknown = [key for key in filters if key not in offers[0]]
        unknown += [op for cond in filters.values() if isinstance(cond, dict) for op in cond if op not in _OPS]
        if unknown:
            return _error(400, "invalid_args", f"unknown search fields or operators {unknown}")
        found = [offer for offer in offers if _passes(offer, filters)]
        for field, direction in reversed(body.get("order") or []):
            found.sort(key=itemgetter(field), reverse=direction == "desc")
        return FakeResponse(200, {"offers": found[: int(body.get("limit") or 64)]})

    # -- renting -------------------------------------------------------------------------------------------------

    def _create(self, request: FakeRequest, offer_id: str) -> FakeResponse:
        body = request.json() or {}
        offer = next((o for o in self.offers if str(o["id"]) == offer_id), None)
        if offer is None or self.faults.out_of_stock or offer["rented"]:
            return _error(404, "no_such_ask", f"Instance type by id {offer_id} is not available.")
        if body.get("client_id") != "me" or not body.get("image") or not isinstance(body.get("disk"), int | float):
            return _error(400, "invalid_args", "client_id, image and disk are required")
        price = body.get("price")
        instance = self._book(offer, body, price)
        if price is not None and (self.faults.bid_too_low or price < offer["min_bid"]):
            self.stop_instance(instance)
            instance.extra["status_msg"] = "bid too low"
            return _error(
                400,
                "insufficient_bid",
                f"Your bid ${price:.3f}/hr is below the minimum bid ${offer['min_bid']:.3f}/hr for this machine.",
                new_contract=int(instance.id),
            )
        return FakeResponse(200, {"success": True, "new_contract": int(instance.id)})

    def _book(self, offer: dict[str, Any], body: dict[str, Any], price: float | None) -> FakeInstance:
        instance_id = self.new_id()
        instance = FakeInstance(
            id=instance_id,
            label=str(body.get("label") or ""),
            gpu=offer["gpu_name"],
            # No price: on-demand, whatever was searched. The disk bills on top of the machine either way.
            price_per_hour=round((offer["dph_base"] if price is None else price) + storage(offer, body), 6),
            spot=price is not None,
            public_key="",
            created=time.time(),
            env={"CONTAINER_ID": instance_id, "CONTAINER_API_KEY": f"instance-scoped-{instance_id}"},
            extra={
                "offer": offer["id"],
                "price": price,
                "request": body,
                "num_gpus": offer["num_gpus"],
                "booked_at": time.time(),  # billing's start (``created`` moves when a stopped instance restarts)
            },
        )
        return self.add(instance)

    def billed_usd(self, instance_id: str) -> float:
        """Dollars Vast bills the instance: its rate (machine and disk) for its billed seconds."""
        return self.billed_seconds(instance_id) * self.instances[instance_id].price_per_hour / 3600

    def _attach_key(self, request: FakeRequest, instance_id: str) -> FakeResponse:
        instance = self.instances.get(instance_id)
        if instance is None or not instance.live:
            return _error(404, "no_such_instance", f"Instance {instance_id} not found.")
        key = str((request.json() or {}).get("ssh_key") or "").strip()
        if not key.startswith(("ssh-", "ecdsa-", "sk-")):
            return _error(400, "invalid_args", "ssh_key is not an OpenSSH public key")
        instance.public_key = f"{instance.public_key}\n{key}".strip()
        if instance.address is not None:  # already running: the key is added to the machine
            (instance.address.home / ".ssh" / "authorized_keys").write_text(instance.public_key + "\n")
        self.save()
        return FakeResponse(200, {"success": True, "msg": "SSH key added to instance."})

    # -- instances -----------------------------------------------------------------------------------------------

    def _show(self, request: FakeRequest, instance_id: str) -> FakeResponse:
        instance = self.instances.get(instance_id)
        row = self.row(instance) if instance is not None and instance.live else None
        return FakeResponse(200, {"instances": row})

    def _list(self, request: FakeRequest) -> FakeResponse:
        return FakeResponse(200, {"instances": [self.row(i) for i in self.live_instances()]})

    def _list_v1(self, request: FakeRequest) -> FakeResponse:
        """One page of ``/api/v1/instances/``: ids after ``after_token``, and ``next_token`` while more follow."""
        limit = min(int((request.query.get("limit") or [str(MAX_PAGE)])[0]), self.page_size, MAX_PAGE)
        after = (request.query.get("after_token") or [""])[0]
        live = sorted(self.live_instances(), key=lambda i: int(i.id))
        if after:
            if not after.startswith("after-") or not after[6:].isdigit():
                return FakeResponse(400, {"detail": f"invalid after_token {after!r}"})
            live = [i for i in live if int(i.id) > int(after[6:])]
        page = live[:limit]
        body: dict[str, Any] = {"instances": [self.row(i) for i in page], "total_instances": len(self.live_instances())}
        if len(live) > limit:
            body["next_token"] = f"after-{page[-1].id}"
        return FakeResponse(200, body)

    def _change(self, request: FakeRequest, instance_id: str) -> FakeResponse:
        instance = self.instances.get(instance_id)
        if instance is None or not instance.live:
            return _error(404, "no_such_instance", f"Instance {instance_id} not found.")
        body = request.json() or {}
        if body.get("state") == "stopped":
            self.stop_instance(instance)
        elif body.get("state") == "running":
            instance.stopped = instance.running_since = instance.address = None
            instance.created = time.time()
        if "label" in body:
            instance.label = str(body["label"])
        self.save()
        return FakeResponse(200, {"success": True})

    def _destroy(self, request: FakeRequest, instance_id: str) -> FakeResponse:
        instance = self.instances.get(instance_id)
        if instance is None or not instance.live:  # Vast's answer now (older ones said no_such_instance)
            return _error(404, "not_found", f"Instance {instance_id} not found.")
        self.terminate_instance(instance)
        return FakeResponse(200, {"success": True})

    def _user(self, request: FakeRequest) -> FakeResponse:
        return FakeResponse(200, {"id": 4242, "username": "tester", "email": "tester@example.com", "credit": 25.0})

    # -- the instance as Vast shows it ---------------------------------------------------------------------------

    def row(self, instance: FakeInstance) -> dict[str, Any]:
        """The instance in Vast's fields."""
        row: dict[str, Any] = {
            "id": int(instance.id),
            "label": instance.label or None,
            "gpu_name": instance.gpu,
            "num_gpus": instance.extra.get("num_gpus", 1),
            "dph_total": instance.price_per_hour,
            "is_bid": instance.spot,
            "image_uuid": instance.extra.get("request", {}).get("image"),
            "start_date": instance.created,
            "public_ipaddr": "127.0.0.1",
            "extra_env": [[k, v] for k, v in instance.env.items()],
            **self._status(instance),
            **self._ssh(instance),
        }
        return self.as_sent(instance.id, row)

    def _status(self, instance: FakeInstance) -> dict[str, Any]:
        lost = instance.extra.get("host_status")
        if lost is not None:
            return _states(str(lost), "running", f"host {lost}")
        if instance.stopped is not None:
            outbid = instance.extra.get("outbid") or instance.extra.get("status_msg") == "bid too low"
            actual = "stopped" if outbid else "exited"
            return _states(actual, "stopped", instance.extra.get("status_msg") or "")
        if instance.running_since is not None:
            return _states("running", "running", "success, running")
        if time.time() < instance.created + self.boot_seconds / 2:
            return _states(None, "running", "")
        return _states("loading", "running", "Pulling image layers")

    def _ssh(self, instance: FakeInstance) -> dict[str, Any]:
        address = instance.address
        proxy_port = 20000 + int(instance.id)
        if address is None:
            return {"ports": None, "ssh_host": "ssh7.fake-vast.invalid", "ssh_port": proxy_port}
        if not self.direct_ports:
            return {"ports": {}, "ssh_host": address.host, "ssh_port": address.port}
        # The proxy is a name that does not resolve: a client that prefers it over the direct port fails to connect.
        mapped = [{"HostIp": "0.0.0.0", "HostPort": str(address.port)}]  # what Vast shows
        return {"ports": {"22/tcp": mapped}, "ssh_host": "ssh7.fake-vast.invalid", "ssh_port": proxy_port}


def _states(actual: str | None, intended: str, message: str) -> dict[str, Any]:
    current = "stopped" if intended == "stopped" else "running"
    return {
        "actual_status": actual,
        "intended_status": intended,
        "cur_state": current,
        "next_state": current,
        "status_msg": message,
    }


def storage(offer: dict[str, Any], body: dict[str, Any]) -> float:
    """What the disk a create asks for bills per hour."""
    return storage_per_hour(offer, float(body.get("disk") or 0))


def _passes(offer: dict[str, Any], filters: dict[str, Any]) -> bool:
    for field, given in filters.items():
        condition = given if isinstance(given, dict) else {"eq": given}
        for op, value in condition.items():
            if not _OPS[op](offer.get(field), value):
                return False
    return True
