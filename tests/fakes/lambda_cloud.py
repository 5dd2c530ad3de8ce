"""A fake Lambda Cloud REST API under ``/api/v1``: instance types, SSH keys, launch, instances, terminate.

Bodies follow Lambda's: ``{"data": ...}`` on success, ``{"error": {"code", "message", "suggestion"?}}`` otherwise.
An instance is ``booting`` (no ip) until ``boot_seconds`` have passed, then ``active`` at ip 127.0.0.1 with a real
sshd that lets in the public key of the SSH key named at launch. Terminated instances stay in every listing with
status ``terminated`` (Lambda drops them after a while; clients must accept both); :meth:`FakeLambda.preempt` takes
a machine back (status ``preempted``, listed until terminated).

Errors carry Lambda's codes: a missing instance or key is 404 ``global/object-does-not-exist``, an unknown route 404
``global/not-found``, a wrong key 401 ``global/invalid-api-key``, an inactive account (``account_inactive``) 403
``global/account-inactive``. The launch schema has no ``quantity``: more than 1 is refused, as Lambda does.
:meth:`FakeLambda.billed_seconds` is what Lambda would bill a machine for: from its launch to its termination.

Lambda's rate limits are enforced per key, as documented: a request less than 1 s after the last one served, or a
launch less than 12 s after the last launch served, is answered 429 (no body Lambda documents, no ``Retry-After``),
by the fake's own ``clock`` (a test passes the one its client's pacer uses, so nobody really sleeps).

The real API has no field for an SSH port (VMs take SSH on 22); the fake's machines listen on random loopback ports,
so a client under test is given :meth:`FakeLambda.ssh_for` as ``LambdaProvider(ssh_for=)``.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from desktop.services.providers.base import SshAddress
from tests.fakes.http import FakeCloud, FakeInstance, FakeRequest, FakeResponse, FiredFault

PREFIX = "/api/v1"

#: Instance types sold: name -> (description, cents per hour, regions with capacity).
TYPES: dict[str, tuple[str, int, list[str]]] = {
    "gpu_1x_a10": ("1x A10 (24 GB PCIe)", 75, ["us-east-1", "us-west-1"]),
    "gpu_1x_h100_pcie": ("1x H100 (80 GB PCIe)", 249, ["us-west-1"]),
    "gpu_8x_a100": ("8x A100 (40 GB SXM4)", 1032, []),
}
REGIONS = {"us-east-1": "Virginia, USA", "us-west-1": "California, USA"}
#: Lambda's limits: seconds between two requests with one key, and between two launches.
LIMITS = (1.0, 12.0)
LAUNCH = "/instance-operations/launch"
TOLERANCE = 1e-6  # float rounding of a clock moved by exactly the interval


class ManualClock:
    """A clock that moves only when someone sleeps on it: a client's pacer and the fake's limits share one."""

    def __init__(self, start: float = 1000.0) -> None:
        self.time = start
        self.slept: list[float] = []

    def now(self) -> float:
        """The time now."""
        return self.time

    async def sleep(self, seconds: float) -> None:
        """Moves the clock on by ``seconds`` at once (and lets other tasks run)."""
        self.slept.append(seconds)
        self.time += max(0.0, seconds)
        await asyncio.sleep(0)


def error(status: int, code: str, message: str, suggestion: str | None = None) -> FakeResponse:
    """Lambda's error body."""
    body: dict[str, Any] = {"code": code, "message": message}
    if suggestion:
        body["suggestion"] = suggestion
    return FakeResponse(status, {"error": body})


def invalid(message: str) -> FakeResponse:
    """A 400 ``global/invalid-parameters``."""
    return error(400, "global/invalid-parameters", message)


def not_found(what: str) -> FakeResponse:
    """A 404 ``global/object-does-not-exist``."""
    return error(404, "global/object-does-not-exist", f"Specified {what} does not exist.")


class FakeLambda(FakeCloud):
    """Lambda Cloud on loopback (``serve()``) or in-process (``transport()``); the client's URL is ``<url>/api/v1``.

    Attributes:
        ssh_keys: Registered keys by id: ``{"id", "name", "public_key"}``.
        account_inactive: Every request is refused with 403 ``global/account-inactive`` (the key itself is fine).
    """

    def __init__(
        self,
        root: Path,
        *,
        boot_seconds: float = 1.0,
        limits: tuple[float, float] | None = LIMITS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(root, boot_seconds=boot_seconds)
        self.ssh_keys: dict[str, dict[str, str]] = {}
        self.account_inactive = False
        self.limits, self.clock = limits, clock
        self.served: list[tuple[float, str, str]] = []  # (clock, method, path) of every request served, not refused
        self._routes = [
            ("GET", r"/instance-types", "_instance_types"),
            ("GET", r"/ssh-keys", "_list_keys"),
            ("POST", r"/ssh-keys", "_add_key"),
            ("DELETE", r"/ssh-keys/(?P<key_id>[^/]+)", "_delete_key"),
            ("POST", r"/instance-operations/launch", "_launch"),
            ("POST", r"/instance-operations/terminate", "_terminate"),
            ("GET", r"/instances", "_list_instances"),
            ("GET", r"/instances/(?P<instance_id>[^/]+)", "_get_instance"),
        ]

    def ssh_for(self, instance_id: str, ip: str) -> SshAddress:
        """Where the fake machine of ``instance_id`` takes SSH (its own port and the local user, not ubuntu:22)."""
        address = self.instances[instance_id].address
        if address is None:
            raise KeyError(f"instance {instance_id} has no machine yet")
        return SshAddress(address.host, address.port, address.user)

    billing_start_key = "launched_at"  # billing starts at the booking, not at a restart

    def preempt(self, instance_id: str) -> None:
        """Lambda takes the machine back: it goes away, and the instance reads ``preempted`` until terminated."""
        with self.lock:
            instance = self.instances[instance_id]
            instance.extra["preempted"] = time.time()
            self.pool.kill(instance.id)
            instance.address = None
            self.save()

    def preempt_instance(self, instance: FakeInstance) -> None:
        """As :meth:`preempt`, recorded as a fault that fired."""
        self.preempt(instance.id)
        with self.lock:
            self.fired.append(FiredFault("preempted", instance=instance.id))

    def is_create(self, request: FakeRequest) -> bool:
        """``POST /instance-operations/launch`` launches an instance."""
        return request.method == "POST" and request.path.rstrip("/").endswith("/instance-operations/launch")

    def is_terminate(self, request: FakeRequest) -> bool:
        """``POST /instance-operations/terminate`` terminates instances."""
        return request.method == "POST" and request.path.rstrip("/").endswith("/instance-operations/terminate")

    def refresh(self, instance: FakeInstance) -> FakeInstance:
        """As the base class, but a preempted machine never boots again."""
        return instance if "preempted" in instance.extra else super().refresh(instance)

    def handle(self, request: FakeRequest) -> FakeResponse:
        """Checks the key and the account, then routes the request."""
        if self.faults.reject_key or request.bearer != self.valid_key:
            return error(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.")
        if self.account_inactive:
            return error(
                403,
                "global/account-inactive",
                "Your account is inactive.",
                "Make sure you have verified your email address and have a valid payment method. "
                "Contact Support if problems continue.",
            )
        path = request.path.removeprefix(PREFIX) if request.path.startswith(PREFIX + "/") else None
        if self._over_limit(request.method, path or ""):
            return FakeResponse(429, b"Too Many Requests")
        self.served.append((self.clock(), request.method, path or ""))
        for method, pattern, answer in self._routes:
            match = re.fullmatch(pattern, path or "")
            if match and method == request.method:
                reply: FakeResponse = getattr(self, answer)(request, **match.groupdict())  # by name: tests patch one
                return reply
        return error(404, "global/not-found", f"No route {request.method} {request.path}")

    def _over_limit(self, method: str, path: str) -> bool:
        """Whether Lambda's limits refuse this request now (measured from the last requests served)."""
        if self.limits is None:
            return False
        every, launches = self.limits
        now = self.clock()
        last = self.served[-1][0] if self.served else None
        last_launch = next((t for t, m, p in reversed(self.served) if (m, p) == ("POST", LAUNCH)), None)
        too_soon = last is not None and now - last < every - TOLERANCE
        launch = (method, path) == ("POST", LAUNCH)
        return too_soon or (launch and last_launch is not None and now - last_launch < launches - TOLERANCE)

    # -- instance types ------------------------------------------------------------------------------------------

    def _instance_types(self, request: FakeRequest) -> FakeResponse:
        return FakeResponse(200, {"data": {name: self._type_entry(name) for name in TYPES}})

    def _type_entry(self, name: str) -> dict[str, Any]:
        description, cents, regions = TYPES[name]
        spec = {"vcpus": 30, "memory_gib": 200, "storage_gib": 1400, "gpus": int(description.split("x")[0])}
        return {
            "instance_type": {
                "name": name,
                "description": description,
                "gpu_description": description.split(" (")[0][3:],
                "price_cents_per_hour": cents,
                "specs": spec,
            },
            "regions_with_capacity_available": [
                {"name": region, "description": REGIONS[region]} for region in regions if not self.faults.out_of_stock
            ],
        }

    # -- SSH keys ------------------------------------------------------------------------------------------------

    def _list_keys(self, request: FakeRequest) -> FakeResponse:
        return FakeResponse(200, {"data": list(self.ssh_keys.values())})

    def _add_key(self, request: FakeRequest) -> FakeResponse:
        body = request.json() or {}
        name, public_key = str(body.get("name") or ""), body.get("public_key")
        if not name or len(name) > 64:
            return invalid("name: String should have at least 1 and at most 64 characters")
        if any(key["name"] == name for key in self.ssh_keys.values()):
            return invalid(f"SSH key name {name!r} is already in use")
        if not public_key:
            return invalid("public_key: the fake does not generate key pairs")
        key = {"id": uuid.uuid4().hex, "name": name, "public_key": str(public_key).strip()}
        self.ssh_keys[key["id"]] = key
        return FakeResponse(200, {"data": key})

    def _delete_key(self, request: FakeRequest, key_id: str) -> FakeResponse:
        key = self.ssh_keys.get(key_id)
        if key is None:
            return not_found("SSH key")
        if any(i.live and i.extra["ssh_key_name"] == key["name"] for i in self.instances.values()):
            return error(400, "ssh-keys/key-in-use", "SSH key is in use by an instance.")
        del self.ssh_keys[key_id]
        return FakeResponse(200, {"data": {}})

    # -- launch and terminate ------------------------------------------------------------------------------------

    def _launch(self, request: FakeRequest) -> FakeResponse:
        body = request.json() or {}
        refused = self._launch_refusal(body)
        if refused is not None:
            return refused
        key = next(k for k in self.ssh_keys.values() if k["name"] == body["ssh_key_names"][0])
        type_name = body["instance_type_name"]
        description, cents, _regions = TYPES[type_name]
        instance = FakeInstance(
            id=uuid.uuid4().hex,
            label=str(body.get("name") or ""),
            gpu=description.split(" (")[0][3:],
            price_per_hour=cents / 100,
            spot=False,
            public_key=key["public_key"],
            created=time.time(),
            extra={
                "region": body["region_name"],
                "instance_type": type_name,
                "ssh_key_name": key["name"],
                "launched_at": time.time(),  # billing's start (``created`` is moved by tests to skip the boot)
            },
        )
        self.add(instance)
        return FakeResponse(200, {"data": {"instance_ids": [instance.id]}})

    def _launch_refusal(self, body: dict[str, Any]) -> FakeResponse | None:
        """Why Lambda would refuse this launch (None: it would not)."""
        names = body.get("ssh_key_names") or []
        known = {key["name"] for key in self.ssh_keys.values()}
        type_name, region = body.get("instance_type_name"), body.get("region_name")
        if int(body.get("quantity", 1)) > 1:
            return invalid("quantity: Input should be less than or equal to 1")
        if len(names) != 1 or names[0] not in known:
            return invalid("ssh_key_names: exactly one registered SSH key name is required")
        if type_name not in TYPES or region not in REGIONS:
            return invalid(f"unknown instance type {type_name!r} or region {region!r}")
        if self.faults.out_of_stock or region not in TYPES[type_name][2]:
            return error(
                400,
                "instance-operations/launch/insufficient-capacity",
                "Not enough capacity to fulfill launch request.",
                "Choose an instance type with more availability, or try again later.",
            )
        return None

    def _terminate(self, request: FakeRequest) -> FakeResponse:
        ids = (request.json() or {}).get("instance_ids") or []
        if any(i not in self.instances for i in ids):
            return not_found("instance")
        for instance_id in ids:
            self.terminate_instance(self.instances[instance_id])
        rows = [self._instance_body(self.instances[i]) for i in ids]
        return FakeResponse(200, {"data": {"terminated_instances": rows}})

    # -- instances -----------------------------------------------------------------------------------------------

    def _list_instances(self, request: FakeRequest) -> FakeResponse:
        return FakeResponse(200, {"data": [self._instance_body(i) for i in self.instances.values()]})

    def _get_instance(self, request: FakeRequest, instance_id: str) -> FakeResponse:
        instance = self.instances.get(instance_id)
        if instance is None:
            return not_found("instance")
        return FakeResponse(200, {"data": self._instance_body(instance)})

    def _status(self, instance: FakeInstance) -> str:
        if not instance.live:
            return "terminated"
        if "preempted" in instance.extra:
            return "preempted"
        return "active" if instance.running_since else "booting"

    def _instance_body(self, instance: FakeInstance) -> dict[str, Any]:
        """Lambda's instance object."""
        type_name = instance.extra["instance_type"]
        description, cents, _regions = TYPES[type_name]
        status = self._status(instance)
        body: dict[str, Any] = {
            "id": instance.id,
            "name": instance.label,
            "status": status,
            "region": {"name": instance.extra["region"], "description": REGIONS[instance.extra["region"]]},
            "instance_type": {"name": type_name, "description": description, "price_cents_per_hour": cents},
            "ssh_key_names": [instance.extra["ssh_key_name"]],
            "file_system_names": [],
            "hostname": f"{instance.id[:8]}.cloud.lambda.ai",
        }
        if status == "active":
            body |= {"ip": "127.0.0.1", "private_ip": "10.0.0.2"}
        return self.as_sent(instance.id, body)
