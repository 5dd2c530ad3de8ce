"""A GPU cloud in memory whose machines are in-memory hosts: for the rental driver's logic and the money soak.

:class:`MemoryCloud` speaks the :class:`~desktop.services.providers.base.Provider` interface without HTTP. Each
machine is a :class:`~tests.fixtures.fake_machine.FakeHost`, reached by a port. It bills like a provider: from the
create until the terminate, by its own clock, and reports both times. A test queues faults on any call, before or
after the cloud acted (``fail``), holds a create until it lets go (``hold_creates``), or takes a machine away.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from desktop.services.providers.base import (
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderError,
    ProviderName,
    RentRequest,
    SshAddress,
    UncertainOutcomeError,
    named_in,
    offer_matches,
)
from desktop.services.providers.listing import Listing
from tests.fixtures.fake_machine import FakeHost

_PORTS = itertools.count(40000)


def offer(provider: ProviderName, offer_id: str, price: float, *, spot: bool = True) -> Offer:
    """An RTX 4090 offer at ``price`` per hour."""
    return Offer(provider, offer_id, "RTX 4090", "rtx4090", 1, 24.0, price, spot, None, "here")


@dataclass(frozen=True)
class Fault:
    """One failure of one call.

    Attributes:
        error: What the call raises: "uncertain" (a timeout, a 5xx, a drop), "refused" (a plain provider error),
            "capacity" (the offer is gone).
        after_acting: The cloud did what was asked before the call failed (a create made the machine, a terminate
            destroyed it).
        delay: Seconds the call takes first (a slow provider).
    """

    error: str = "uncertain"
    after_acting: bool = False
    delay: float = 0.0


class MemoryCloud:
    """A provider in memory: offers, machines that start on the first look, faults a test queues."""

    def __init__(
        self,
        name: ProviderName,
        offers: list[Offer],
        hosts: dict[int, FakeHost],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name, self._offers, self.hosts, self.clock = name, offers, hosts, clock
        self.instances: dict[str, Instance] = {}
        self.requests: list[RentRequest] = []
        self.terminated: list[str] = []
        self.no_capacity_for: set[str] = set()
        self.on_create: Any = None  # called with the new host: its trainer script
        self.faults: dict[str, list[Fault]] = {}
        self.hold_creates: asyncio.Event | None = None  # set: creates go on; clear: they wait
        self.creates_held = 0  # creates that reached the provider and waited on hold_creates
        self.billed: dict[str, tuple[float, float | None]] = {}
        self.reports_start_times = True  # False: like Lambda, machines come without a created_at
        self.no_public_port_for: set[str] = set()  # offer ids whose machines run without an SSH address (RunPod's
        # community pods on a host with no public IP: ``ssh.direct`` stays null)
        self._ids = itertools.count(1)

    def fail(self, call: str, *faults: Fault) -> None:
        """Queues faults for the next calls of ``call`` ("create", "get", "terminate", "named", "offers")."""
        self.faults.setdefault(call, []).extend(faults)

    async def _fault(self, call: str) -> Fault | None:
        queue = self.faults.get(call)
        fault = queue.pop(0) if queue else None
        if fault is not None and fault.delay:
            await asyncio.sleep(fault.delay)
        if fault is not None and not fault.after_acting:
            self._raise(fault, call)
        return fault

    def _raise(self, fault: Fault, call: str) -> None:
        if fault.error == "uncertain":
            raise UncertainOutcomeError(self.name, f"{call}: the request timed out (injected)")
        if fault.error == "capacity":
            raise NoCapacityError(self.name, f"{call}: the offer is gone (injected)")
        raise ProviderError(self.name, f"{call}: refused (injected)")

    async def check_key(self) -> None:
        """Every key is good."""

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """The offers matching ``query``."""
        await self._fault("offers")
        return [o for o in self._offers if offer_matches(o, query)]

    async def create(self, request: RentRequest) -> Instance:
        """Makes a machine (after a held create is let go), then fails if a fault says so."""
        if self.hold_creates is not None:
            self.creates_held += 1
            await self.hold_creates.wait()
        fault = await self._fault("create")
        if request.offer.offer_id in self.no_capacity_for:
            raise NoCapacityError(self.name, f"offer {request.offer.offer_id} is gone")
        await request.sending()  # a slow provider's delay (say, a key uploaded first) is over: the create goes out
        instance = self._make(request)
        if fault is not None:
            self._raise(fault, "create")
        return instance

    def _make(self, request: RentRequest) -> Instance:
        self.requests.append(request)
        port, host = next(_PORTS), FakeHost()
        self.hosts[port] = host
        if self.on_create is not None:
            self.on_create(host)
        instance_id = f"{self.name.value}-{next(self._ids)}"
        price = request.bid_per_hour or request.offer.price_per_hour
        ssh = None if request.offer.offer_id in self.no_public_port_for else SshAddress("fake", port, "root")
        now = self.clock()
        self.billed[instance_id] = (now, None)
        self.instances[instance_id] = Instance(
            self.name,
            instance_id,
            request.label,
            InstanceState.STARTING,
            price,
            "RTX 4090",
            request.offer.spot,
            ssh,
            created_at=now if self.reports_start_times else None,
        )
        return self.instances[instance_id]

    async def get(self, instance_id: str) -> Instance:
        """The machine now (a starting one is running from its first look)."""
        await self._fault("get")
        instance = self.instances.get(instance_id)
        if instance is None:
            return Instance(self.name, instance_id, "", InstanceState.TERMINATED, 0.0)
        if instance.state is InstanceState.STARTING:
            self.instances[instance_id] = instance = replace(instance, state=InstanceState.RUNNING)
        return instance

    def take_away(self, instance_id: str, state: InstanceState = InstanceState.STOPPED) -> None:
        """The machine is outbid, preempted or lost: it stops billing now (for a lost one: it is gone)."""
        self._end_billing(instance_id)
        ended = self.billed[instance_id][1]
        self.instances[instance_id] = replace(self.instances[instance_id], state=state, ended_at=ended)

    def _end_billing(self, instance_id: str) -> None:
        started, ended = self.billed[instance_id]
        if ended is None:
            self.billed[instance_id] = (started, self.clock())

    async def stop(self, instance_id: str) -> None:
        """Stops the machine (it stops billing)."""
        self.take_away(instance_id)

    async def terminate(self, instance_id: str) -> None:
        """Destroys the machine (a machine already gone is fine)."""
        fault = await self._fault("terminate")
        if instance_id in self.instances:
            self.terminated.append(instance_id)
            self._end_billing(instance_id)
            ended = self.billed[instance_id][1]
            self.instances[instance_id] = replace(
                self.instances[instance_id], state=InstanceState.TERMINATED, ended_at=ended
            )
        if fault is not None:
            self._raise(fault, "terminate")

    async def instances(self) -> list[Instance]:
        """Every machine, gone ones included."""
        await self._fault("instances")
        return list(self.instances.values())

    async def listing(self) -> Listing:
        """Every machine, gone ones included, with nothing left out."""
        await self._fault("instances")
        return Listing(self.name, list(self.instances.values()))

    async def complete_create(self, instance_id: str, request: RentRequest) -> None:
        """Nothing to complete: the create carried everything."""

    async def named(self, label: str) -> list[Instance]:
        """The machines named ``label`` that are not gone."""
        await self._fault("named")
        return named_in(list(self.instances.values()), label)

    async def aclose(self) -> None:
        """Nothing to close."""

    def live(self) -> list[Instance]:
        """The machines that bill now."""
        return [i for i in self.instances.values() if self.billed[i.instance_id][1] is None]

    def billed_seconds(self, instance_id: str) -> float:
        """Seconds the machine billed (up to now while it bills)."""
        started, ended = self.billed[instance_id]
        return (ended if ended is not None else self.clock()) - started
