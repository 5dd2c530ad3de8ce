"""The rental driver's decisions, on in-memory clouds whose machines are in-memory hosts (no sshd, no training).

Each cloud hands out a :class:`~tests.fixtures.fake_machine.FakeHost` per machine, reached by its port; a test
takes a machine away, runs a provider out of stock, or caps the machines, and checks what was rented, what was
terminated and how the run ended.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import filelock
import pytest

from desktop.core.runs.labels import parse_label
from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.rentals import rental_of
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.providers.base import ProviderName
from desktop.services.runs import engine as engine_module
from desktop.services.runs.engine import DRIVER_LOCK_NAME, RunBusyError
from tests.fakes.memory_cloud import Fault, MemoryCloud, offer
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.runs.rental_world import (
    World,
    checkpoint_then_keep_training,
    ssh_always_greets,  # noqa: F401 - autouse: machines greet at once
    trains_to_the_end,
)


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
    label = parse_label(request.label)
    assert request.offer.offer_id == "dearer" and label is not None and label.run_id == run_id
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


async def test_a_machine_that_trains_nothing_is_terminated_by_the_idle_guard_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    world, hosts = World(tmp_path), list[Any]()

    def hangs_after_a_checkpoint(host: Any) -> None:  # the first trainer stays alive but trains nothing
        hosts.append(host)
        host.on_launch = checkpoint_then_keep_training if len(hosts) == 1 else trains_to_the_end

    world.runpod.on_create = hangs_after_a_checkpoint
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True, idle_minutes=0.05))  # 3 s idle

    final = await asyncio.wait_for(world.driver.drive(run_id), 60)

    assert final.state is RunState.FINISHED, final.error
    machines = world.engine.store.get(run_id).spec["machines"]
    assert len(machines) == 2 and "idle guard" in machines[0]["why"], machines
    assert world.runpod.terminated == ["runpod-1", "runpod-2"]
    assert [r.stopped is not None for r in Ledger().rentals(run_id)] == [True, True]
    assert any("checkpoint-2" in name for name in hosts[1].files), "the new machine resumes from the checkpoint"


async def test_a_run_whose_ssh_key_is_gone_rents_with_a_fresh_pair(tmp_path: Path) -> None:
    """A paused run whose record lost its public key (or whose private half went with an earlier ending) rents with
    a new pair, never a KeyError shown as "the machine could not be reached"."""
    from desktop.services.machines.keys import delete_run_key

    world = World(tmp_path)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    spec = {k: v for k, v in world.engine.store.get(run_id).spec.items() if k != "run_key_public"}
    world.engine.store.update(run_id, spec=spec)
    delete_run_key(run_id)
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    [request] = world.runpod.requests
    assert request.public_key.startswith("ssh-ed25519 ") and request.public_key.endswith(f"rentune-run-{run_id}")
    recorded = world.engine.store.get(run_id).spec["run_key_public"]
    assert recorded == request.public_key, "the run logs in with the new pair"


class ClosableClient:
    """A cloud's client that, like an httpx-based one, refuses every call once closed."""

    def __init__(self, cloud: MemoryCloud) -> None:
        self._cloud, self._closed = cloud, False

    async def aclose(self) -> None:
        self._closed = True

    def __getattr__(self, name: str) -> Any:
        if self._closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        return getattr(self._cloud, name)


async def test_a_run_ending_leaves_the_clients_of_another_run_the_same_driver_follows_open(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.driver._open = lambda name, _secrets: ClosableClient(world.clouds[name])
    world.vast.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    world.vast.hold_creates = asyncio.Event()
    world.vast.fail("create", Fault("uncertain", after_acting=True))  # the machine is then looked up by its label
    drive = asyncio.ensure_future(world.driver.drive(world.create(ComputeSpec("vast", gpu="RTX 4090", spot=True))))
    while not world.vast.creates_held:
        await asyncio.sleep(0.01)
    world.runpod._offers = []
    other = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    failing = await asyncio.wait_for(world.driver.drive(other), 30)
    assert failing.state is RunState.FAILED, "the second run ends while the first one's create is in flight"
    world.vast.hold_creates.set()
    final = await asyncio.wait_for(drive, 30)
    assert final.state is RunState.FINISHED, final.error
    assert world.vast.live() == [] and world.vast.terminated == ["vast-1"]


@pytest.mark.parametrize("died", ["before it answered", "after it was marked up, before the run pointed at it"])
async def test_a_machine_whose_process_died_while_it_came_up_is_waited_for_again_not_given_up(
    tmp_path: Path, died: str
) -> None:
    world = World(tmp_path)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    compute = ComputeSpec("runpod", gpu="RTX 4090", spot=True)
    run_id = world.create(compute)
    [rp] = world.runpod._offers
    await world.driver._create(run_id, compute, rp)  # rented and recorded; the process dies before it is up
    if died.startswith("after"):
        rental = rental_of(world.engine.store.get(run_id))
        assert rental is not None
        world.engine.ctx.set_spec(run_id, rental=replace(rental, ready=rental.created + 1).as_dict())
    assert world.engine.store.get(run_id).target is None
    final = await asyncio.wait_for(world.driver_for(world).drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    assert world.runpod.terminated == ["runpod-1"] and len(world.runpod.requests) == 1, "the paid-for boot was used"
    assert any("still coming up when Rentune last stopped" in line for line in world.lines)


async def test_a_machine_gone_after_its_run_ended_is_not_a_lost_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's end terminates its machine; work the engine does after that end (here: the bucket's uploads made
    ahead, slow to abort) must not let the provider watch take the machine for lost and rent another."""
    world = World(tmp_path)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))

    async def slow_end_of_run_work(_ctx: object, _run_id: str) -> None:
        await asyncio.sleep(3)  # the watch polls far more often than this

    monkeypatch.setattr(engine_module.bucket_courier, "withdraw", slow_end_of_run_work)
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    assert len(world.runpod.requests) == 1 and world.runpod.terminated == ["runpod-1"], "no second machine"
    assert not any("continuing on a new machine" in line for line in world.lines)
