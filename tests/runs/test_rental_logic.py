"""The rental driver's decisions, on in-memory clouds whose machines are in-memory hosts (no sshd, no training).

Each cloud hands out a :class:`~tests.fixtures.fake_machine.FakeHost` per machine, reached by its port; a test
takes a machine away, runs a provider out of stock, or caps the machines, and checks what was rented, what was
terminated and how the run ended.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import filelock
import pytest

from desktop.core.runs.spec import ComputeSpec, RunSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.rentals import rental_of
from desktop.services.machines.ssh import Endpoint
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.providers.base import (
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderName,
    RentRequest,
    SshAddress,
    offer_matches,
)
from desktop.services.renting import driver as rental
from desktop.services.renting.driver import RentalDriver, RentalOptions
from desktop.services.runs.engine import DRIVER_LOCK_NAME, EngineOptions, RunBusyError, RunEngine
from desktop.services.runs.store import RunStore
from tests.fixtures.fake_machine import FakeHost
from tests.fixtures.memory_keyring import MemoryKeyring
from trainer_payload.protocol import EventKind

_PORTS = itertools.count(40000)


def offer(provider: ProviderName, offer_id: str, price: float, *, spot: bool = True) -> Offer:
    return Offer(provider, offer_id, "RTX 4090", "rtx4090", 1, 24.0, price, spot, None, "here")


class MemoryCloud:
    """A provider in memory: offers, machines that start on the first look, faults a test switches on."""

    def __init__(self, name: ProviderName, offers: list[Offer], hosts: dict[int, FakeHost]) -> None:
        self.name, self._offers, self.hosts = name, offers, hosts
        self.instances: dict[str, Instance] = {}
        self.requests: list[RentRequest] = []
        self.terminated: list[str] = []
        self.no_capacity_for: set[str] = set()
        self.on_create: Any = None  # called with the new host: its trainer script

    async def check_key(self) -> None:
        return None

    async def offers(self, query: OfferQuery) -> list[Offer]:
        return [o for o in self._offers if offer_matches(o, query)]

    async def create(self, request: RentRequest) -> Instance:
        if request.offer.offer_id in self.no_capacity_for:
            raise NoCapacityError(self.name, f"offer {request.offer.offer_id} is gone")
        self.requests.append(request)
        port, host = next(_PORTS), FakeHost()
        self.hosts[port] = host
        if self.on_create is not None:
            self.on_create(host)
        instance_id = f"{self.name.value}-{len(self.requests)}"
        price = request.bid_per_hour or request.offer.price_per_hour
        ssh = SshAddress("fake", port, "root")
        self.instances[instance_id] = Instance(
            self.name, instance_id, request.label, InstanceState.STARTING, price, "RTX 4090", request.offer.spot, ssh
        )
        return self.instances[instance_id]

    async def get(self, instance_id: str) -> Instance:
        instance = self.instances[instance_id]
        if instance.state is InstanceState.STARTING:
            self.instances[instance_id] = instance = replace(instance, state=InstanceState.RUNNING)
        return instance

    def take_away(self, instance_id: str) -> None:
        self.instances[instance_id] = replace(self.instances[instance_id], state=InstanceState.STOPPED)

    async def stop(self, instance_id: str) -> None:
        self.take_away(instance_id)

    async def terminate(self, instance_id: str) -> None:
        self.terminated.append(instance_id)
        self.instances[instance_id] = replace(self.instances[instance_id], state=InstanceState.TERMINATED)

    async def instances(self) -> list[Instance]:
        return list(self.instances.values())

    async def aclose(self) -> None:
        return None


def checkpoint_then_keep_training(host: FakeHost, folder: str) -> None:
    digests = host.write_folder(f"{folder}/out/checkpoints/checkpoint-2", {"adapter.safetensors": b"step 2"})
    host.emit(EventKind.CHECKPOINT, step=2, path="checkpoints/checkpoint-2", bytes=6, sha256=digests)


def trains_to_the_end(host: FakeHost, folder: str) -> None:
    files = host.write_folder(f"{folder}/out/adapter", {"adapter_model.safetensors": b"final weights"})
    host.emit(EventKind.DONE, adapter_path="adapter", files=files)


@pytest.fixture(autouse=True)
def ssh_always_greets(monkeypatch: pytest.MonkeyPatch) -> None:
    async def greets(_host: str, _port: int, time_limit: float = 5.0) -> bool:
        return True

    monkeypatch.setattr(rental, "ssh_banner", greets)


class World:
    """Two clouds, their hosts, an engine and a driver wired to them."""

    def __init__(self, tmp_path: Path, *, max_machines: int = 5) -> None:
        self.hosts: dict[int, FakeHost] = {}
        self.lines: list[str] = []
        self.runpod = MemoryCloud(ProviderName.RUNPOD, [offer(ProviderName.RUNPOD, "rp-1", 0.30)], self.hosts)
        self.vast = MemoryCloud(ProviderName.VAST, [offer(ProviderName.VAST, "va-1", 0.25)], self.hosts)
        clouds = {ProviderName.RUNPOD: self.runpod, ProviderName.VAST: self.vast}
        options = EngineOptions(poll_seconds=0.02, grace_seconds=0.5)
        self.engine = RunEngine(RunStore(), SecretStore(), options, report=self.lines.append, connect=self.connect)
        driver_options = RentalOptions(poll_seconds=0.05, ready_poll_seconds=0.01, max_machines=max_machines)
        self.driver = RentalDriver(self.engine, options=driver_options, open_provider=lambda n, _s: clouds[n])
        self.train = tmp_path / "train.jsonl"
        self.train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')

    async def connect(self, endpoint: Endpoint, pinned: str | None, time_limit: float) -> Any:
        return await self.hosts[endpoint.port].connect(endpoint, pinned, time_limit)

    def create(self, compute: ComputeSpec, budget: float = 0.0) -> str:
        spec = RunSpec("org/tiny-model", self.train, None, {"max_steps": 4}, None, budget, compute=compute)
        return self.engine.create(spec).id


async def take_away_after_a_checkpoint(world: World, cloud: MemoryCloud, run_id: str) -> None:
    while not list(world.engine.folder(run_id).glob("checkpoints/checkpoint-2")):
        await asyncio.sleep(0.01)
    rented = rental_of(world.engine.store.get(run_id))
    assert rented is not None
    cloud.take_away(rented.instance_id)


async def test_a_spot_machine_taken_away_moves_to_another_allowed_provider(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", checkpoint_then_keep_training)
    world.vast.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True, providers=("vast",)))
    world.runpod.no_capacity_for = set()

    async def scenario() -> Any:
        drive = asyncio.ensure_future(world.driver.drive(run_id))
        await take_away_after_a_checkpoint(world, world.runpod, run_id)
        world.runpod._offers = []  # RunPod has nothing left: the run may move to Vast.ai
        return await drive

    final = await asyncio.wait_for(scenario(), 30)
    assert final.state is RunState.FINISHED, final.error
    machines = world.engine.store.get(run_id).spec["machines"]
    assert [m["provider"] for m in machines] == ["runpod", "vast"]
    assert "spot machine outbid or preempted" in machines[0]["why"] and machines[1]["why"] == "the adapter is home"
    assert world.runpod.terminated == ["runpod-1"] and world.vast.terminated == ["vast-1"]
    rentals = Ledger().rentals(run_id)
    assert [r.stopped is not None for r in rentals] == [True, True]
    uploaded = [name for host in world.hosts.values() for name in host.files if "checkpoint-2" in name]
    assert uploaded, "the new machine got the newest checkpoint from home"


async def test_the_first_machine_comes_from_the_named_provider_only(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.vast.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    world.runpod._offers = []
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True, providers=("vast",)))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FAILED and "no offer in stock matches 1x RTX 4090 spot" in str(final.error)
    assert world.vast.requests == [], "Vast.ai is only where a spot run may move, not where it starts"


async def test_a_gone_offer_is_skipped_for_the_next_cheapest(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.runpod._offers = [offer(ProviderName.RUNPOD, "cheap", 0.20), offer(ProviderName.RUNPOD, "dearer", 0.40)]
    world.runpod.no_capacity_for = {"cheap"}
    world.runpod.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True, max_price_per_hour=0.41))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED
    [request] = world.runpod.requests
    assert request.offer.offer_id == "dearer" and request.label == f"rentune-{run_id}"
    assert request.bid_per_hour == pytest.approx(0.41), "the bid is 5 % over the price, capped at the maximum"
    assert any("could not rent RTX 4090 at RunPod: offer cheap is gone" in line for line in world.lines)


async def test_a_run_stops_renting_at_its_machine_limit(tmp_path: Path) -> None:
    world = World(tmp_path, max_machines=1)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", checkpoint_then_keep_training)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))

    async def scenario() -> Any:
        drive = asyncio.ensure_future(world.driver.drive(run_id))
        await take_away_after_a_checkpoint(world, world.runpod, run_id)
        return await drive

    final = await asyncio.wait_for(scenario(), 30)
    assert final.state is RunState.FAILED
    assert "1 machines were rented for this run, the limit: not renting more" in str(final.error)
    assert world.runpod.terminated == ["runpod-1"] and len(world.runpod.requests) == 1


async def test_lambda_self_stop_sends_the_key_on_stdin_only(tmp_path: Path, memory_keyring: MemoryKeyring) -> None:
    world = World(tmp_path)
    lam = MemoryCloud(ProviderName.LAMBDA, [offer(ProviderName.LAMBDA, "la-1", 0.75, spot=False)], world.hosts)
    lam.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    world.driver._open = lambda _n, _s: lam
    SecretStore().set(SecretName.LAMBDA, "lambda-secret-key")
    compute = ComputeSpec("lambda", gpu="RTX 4090", self_stop_minutes=30, send_api_key=True)
    run_id = world.create(compute)
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED
    [host] = world.hosts.values()
    armed = [c for c in host.commands if "trainer_payload.self_stop" in c]
    assert armed and all("lambda-secret-key" not in c for c in host.commands), "never in a command line"
    assert any('"api_key": "lambda-secret-key"' in s and '"provider": "lambda"' in s for s in host.stdins)


async def test_a_run_followed_elsewhere_is_neither_rented_for_nor_let_go(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", checkpoint_then_keep_training)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    elsewhere = filelock.FileLock(world.engine.folder(run_id) / DRIVER_LOCK_NAME)
    elsewhere.acquire()  # the app follows the run
    try:
        with pytest.raises(RunBusyError):
            await world.driver.drive(run_id)
    finally:
        elsewhere.release()
    assert world.runpod.requests == [] and world.runpod.terminated == []
