"""No machine bills after its run ended: a rental left ``live`` behind an ended run (the process ended the run and was
killed before the terminate) is terminated until gone at the next start, with the real clients on the fake RunPod,
Vast and Lambda APIs in process. A live run's machine, and a run another process drives, are left alone.

Nothing here logs in to a machine, so the fakes' machines are entries in memory (:class:`PaperPool`), not sshds.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock
import pytest

from desktop.core.runs.labels import machine_label
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger, Rental, RentalState
from desktop.services.providers.base import InstanceState, OfferQuery, Provider, ProviderName, RentRequest
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.lambda_cloud import LambdaProvider
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.providers.vast import VastProvider
from desktop.services.renting.creating import CreateTiming, Creator
from desktop.services.renting.reconcile import RENTING_LOCK_NAME, Settlement, settle_rentals
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.store import RunStore
from tests.fakes.http import FakeCloud
from tests.fakes.lambda_cloud import FakeLambda
from tests.fakes.machines import MachineAddress
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast

#: The GPU each fake sells.
GPU = {ProviderName.RUNPOD: "RTX 4090", ProviderName.VAST: "RTX 4090", ProviderName.LAMBDA: "A10"}
#: Where each client finds its fake (the in-process transport ignores the host).
URL = {
    ProviderName.RUNPOD: "https://runpod.fake/v2",
    ProviderName.VAST: "https://vast.fake/api/v0",
    ProviderName.LAMBDA: "https://lambda.fake/api/v1",
}
FAKES: dict[ProviderName, type[FakeCloud]] = {
    ProviderName.RUNPOD: FakeRunPod,
    ProviderName.VAST: FakeVast,
    ProviderName.LAMBDA: FakeLambda,
}
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample run"
#: Seconds the app's and the fake's clock readings around one in-process call may differ (both read time.time()):
#: the part of a machine's billed time the 1 % cannot cover when it lived for a second.
CLOCK_SKEW_S = 0.05
#: Seconds an end Rentune estimated (the provider reports none) may be off: one terminate's round trip.
ROUND_TRIP_S = 0.25


async def no_wait(_seconds: float) -> None:
    await asyncio.sleep(0)


class PaperPool:
    """The interface of :class:`tests.fakes.machines.MachinePool` with machines that are only entries (no sshd)."""

    ports = itertools.count(41000)

    def __init__(self) -> None:
        self.up: dict[str, int] = {}

    def start(self, machine_id: str, public_key: str, env: dict[str, str] | None = None) -> MachineAddress:
        """The machine's address (it "boots" at once)."""
        self.up[machine_id] = next(self.ports)
        return MachineAddress("127.0.0.1", self.up[machine_id], "root", "ssh-ed25519 AAAAhost", Path("/nonexistent"))

    def kill(self, machine_id: str) -> None:
        """The machine goes away."""
        self.up.pop(machine_id, None)

    def kill_all(self) -> None:
        """Every machine goes away."""
        self.up.clear()

    def alive(self, machine_id: str) -> bool:
        """Whether the machine is up."""
        return machine_id in self.up


@dataclass
class Cloud:
    """One fake provider and the real client on it."""

    name: ProviderName
    fake: FakeCloud
    client: Provider

    def open(self, _name: ProviderName, _secrets: object) -> Provider:
        """The provider opener settling uses: a fresh real client each time (settling closes it)."""
        return client_of(self.name, self.fake)


def client_of(name: ProviderName, fake: FakeCloud) -> Provider:
    """The real client of ``name`` on its fake, in process, retrying at once."""
    retry = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.05)
    transport, key = fake.transport(), fake.valid_key
    if name is ProviderName.RUNPOD:
        return RunPodProvider(
            key, URL[name], transport=transport, retry=retry, graphql_url="https://runpod.fake/graphql"
        )
    if name is ProviderName.VAST:
        return VastProvider(key, URL[name], transport=transport, retry=retry)
    assert isinstance(fake, FakeLambda)
    return LambdaProvider(key, URL[name], transport=transport, retry=retry, ssh_for=fake.ssh_for)


@pytest.fixture
def clouds(tmp_path: Path) -> Iterator[dict[ProviderName, FakeCloud]]:
    """The three fakes, machines booting at once."""
    fakes = {name: fake(tmp_path / name.value, boot_seconds=0.0) for name, fake in FAKES.items()}
    for fake in fakes.values():
        fake.pool = PaperPool()  # type: ignore[assignment]
    yield fakes
    for fake in fakes.values():
        fake.close()


@pytest.fixture
async def runpod(clouds: dict[ProviderName, FakeCloud]) -> AsyncIterator[Cloud]:
    """The fake RunPod and its real client."""
    async for cloud in _cloud(ProviderName.RUNPOD, clouds):
        yield cloud


async def _cloud(name: ProviderName, clouds: dict[ProviderName, FakeCloud]) -> AsyncIterator[Cloud]:
    client = client_of(name, clouds[name])
    yield Cloud(name, clouds[name], client)
    await client.aclose()


def ended_run(state: RunState = RunState.FINISHED) -> str:
    """A run recorded in ``state`` (a run that rented a machine, as far as settling cares)."""
    store = RunStore()
    run_id = store.create({"base_model": "org/tiny-model"}, None).id
    if state is not RunState.PLANNED:
        store.transition(run_id, state, "as the killed process left it")
    return run_id


async def rent(cloud: Cloud, run_id: str, ledger: Ledger, *, nodes: int = 1) -> Rental:
    """Rents a machine (or a cluster) for the run as the driver does, recorded first, and waits until it runs."""
    offers = await cloud.client.offers(OfferQuery(gpu=GPU[cloud.name], nodes=nodes))
    offer = next(o for o in offers if o.in_stock and not o.spot)
    request = RentRequest(offer, PUBLIC_KEY, machine_label("0123abcd", run_id), "runpod/pytorch")
    timing = CreateTiming(answer_wait=2.0, lookups=2, lookup_delay=0.05, terminate_patience=5.0)
    row, instance = await Creator(ledger, Terminator(ledger, sleep=no_wait), timing).create(
        cloud.client, run_id, request, offer.price_per_hour
    )
    while (await cloud.client.get(instance.instance_id)).state is not InstanceState.RUNNING:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # it bills a while: 1 % of its time is more than the clocks' skew
    assert row.state is RentalState.LIVE
    return row


async def settle(cloud: Cloud, ledger: Ledger) -> Settlement:
    """One start's settling, as the app and every settling CLI command run it."""
    return await settle_rentals(
        RunStore(), ledger=ledger, open=cloud.open, terminator=Terminator(ledger, sleep=no_wait), patience=10.0
    )


def billing(cloud: Cloud) -> list[str]:
    """The fake's machines that bill now (every one not terminated)."""
    return [instance.id for instance in cloud.fake.live_instances()]


def assert_booked_as_billed(cloud: Cloud, row: Rental) -> None:
    """The row's dollars equal the fake's billed seconds times its price: within 1 % (or the clocks' skew)."""
    assert row.stopped is not None, "the row is closed"
    assert row.instance_id is not None
    billed = cloud.fake.billed_seconds(row.instance_id) * row.price_per_hour / 3600
    skew = (ROUND_TRIP_S if row.end_estimated else CLOCK_SKEW_S) * row.price_per_hour / 3600
    assert abs(row.usd(time.time()) - billed) <= max(0.01 * billed, skew), (row, billed)


@pytest.mark.parametrize(
    ("name", "state"),
    [
        (ProviderName.RUNPOD, RunState.FINISHED),
        (ProviderName.VAST, RunState.FAILED),
        (ProviderName.LAMBDA, RunState.CANCELLED),
    ],
)
async def test_a_machine_left_running_after_its_run_ended_is_terminated_at_the_next_start(
    clouds: dict[ProviderName, FakeCloud], name: ProviderName, state: RunState
) -> None:
    async for cloud in _cloud(name, clouds):
        ledger = Ledger()
        run_id = ended_run(RunState.PLANNED)
        row = await rent(cloud, run_id, ledger)
        RunStore().transition(run_id, state, "the process died before terminating its machine")
        assert billing(cloud) == [row.instance_id]
        settled = await settle(cloud, ledger)
        assert billing(cloud) == [], "the provider says it is gone"
        [ended] = ledger.rentals(run_id)
        assert ended.state is RentalState.ENDED and [r.instance_id for r in settled.run_ended] == [row.instance_id]
        assert_booked_as_billed(cloud, ended)
        [line] = settled.lines
        assert f"machine {row.instance_id} of run {run_id}" in line and "the run had ended" in line, line


async def test_a_terminate_that_fails_at_the_next_start_is_retried_until_the_machine_is_gone(runpod: Cloud) -> None:
    ledger = Ledger()
    run_id = ended_run(RunState.PLANNED)
    row = await rent(runpod, run_id, ledger)
    RunStore().transition(run_id, RunState.FINISHED)
    runpod.fake.faults.failing_terminates = 3
    settled = await settle(runpod, ledger)
    assert runpod.fake.faults.failing_terminates == 0, "every failing terminate was tried"
    assert billing(runpod) == [] and [r.instance_id for r in settled.run_ended] == [row.instance_id]
    [ended] = ledger.rentals(run_id)
    assert ended.state is RentalState.ENDED
    assert_booked_as_billed(runpod, ended)


async def test_a_cluster_left_running_after_its_run_ended_is_deleted_and_each_machine_booked(runpod: Cloud) -> None:
    assert isinstance(runpod.fake, FakeRunPod)
    ledger = Ledger()
    run_id = ended_run(RunState.PLANNED)
    cluster = await rent(runpod, run_id, ledger, nodes=2)
    RunStore().transition(run_id, RunState.FINISHED)
    assert len(billing(runpod)) == 2 and [r.state for r in ledger.rentals(run_id)] == [RentalState.LIVE] * 2
    settled = await settle(runpod, ledger)
    [book] = runpod.fake.clusters.values()
    assert book.deleted is not None and billing(runpod) == [], "the cluster and each of its machines are gone"
    assert [r.instance_id for r in settled.run_ended] == [cluster.instance_id], "settled as one"
    rows = ledger.rentals(run_id)
    assert [r.state for r in rows] == [RentalState.ENDED] * 2
    for rental, billed in zip(rows, runpod.fake.members_billed_usd(book.id), strict=True):
        assert rental.stopped is not None
        skew = CLOCK_SKEW_S * rental.price_per_hour / 3600
        assert abs(rental.usd(rental.stopped) - billed) <= max(0.01 * billed, skew), (rental, billed)


@pytest.mark.parametrize("state", [RunState.TRAINING, RunState.PAUSED, RunState.PULLING])
async def test_the_machine_of_a_run_not_ended_is_left_alone(runpod: Cloud, state: RunState) -> None:
    ledger = Ledger()
    run_id = ended_run(RunState.PLANNED)
    row = await rent(runpod, run_id, ledger)
    RunStore().transition(run_id, state)
    settled = await settle(runpod, ledger)
    assert settled == Settlement() and billing(runpod) == [row.instance_id]
    assert [r.state for r in ledger.rentals(run_id)] == [RentalState.LIVE]


async def test_an_ended_run_another_process_drives_is_left_to_it(runpod: Cloud) -> None:
    ledger = Ledger()
    run_id = ended_run(RunState.PLANNED)
    row = await rent(runpod, run_id, ledger)
    RunStore().transition(run_id, RunState.FINISHED)
    held = filelock.FileLock(RunStore().folder(run_id) / RENTING_LOCK_NAME)
    held.acquire()  # another process drives it now (it is terminating the machine itself)
    try:
        settled = await settle(runpod, ledger)
    finally:
        held.release()
    assert [r.instance_id for r in settled.busy] == [row.instance_id] and not settled.run_ended
    assert billing(runpod) == [row.instance_id] and [r.state for r in ledger.rentals(run_id)] == [RentalState.LIVE]
    settled = await settle(runpod, ledger)  # that process is gone: the next start ends it
    assert billing(runpod) == [] and [r.state for r in ledger.rentals(run_id)] == [RentalState.ENDED]


def test_every_settling_command_settles_an_ended_runs_live_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rentune run|resume|runs|machines|costs`` settle first: a live row behind an ended run is reason enough."""
    from desktop.cli.settle import settle_at_start
    from desktop.services.renting import reconcile

    asked: list[list[Rental]] = []

    async def settling(store: RunStore, *_args: object, ledger: Ledger, **_kwargs: object) -> Settlement:
        asked.append(ledger.machines())
        return Settlement()

    monkeypatch.setattr(reconcile, "settle_rentals", settling)
    ledger, run_id = Ledger(), ended_run(RunState.PLANNED)
    ledger.open(run_id, "runpod", "pod-1", "RTX 4090", 0.69)
    settle_at_start()
    assert asked == [], "a live run's machine is nothing to settle"
    RunStore().transition(run_id, RunState.FINISHED)
    settle_at_start()
    assert [[r.instance_id for r in machines] for machines in asked] == [["pod-1"]]


async def test_a_run_resumed_after_settling_listed_it_is_left_to_its_driver(
    runpod: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the listing and the run's lock the user resumed the stopped run: its machine is the driver's again."""
    import contextlib

    from desktop.services.renting import reconcile

    ledger = Ledger()
    run_id = ended_run(RunState.PLANNED)
    row = await rent(runpod, run_id, ledger)
    RunStore().transition(run_id, RunState.CANCELLED)
    real_lock = reconcile.renting_lock

    @contextlib.contextmanager
    def resumed_first(folder: Path) -> Iterator[bool]:
        RunStore().transition(run_id, RunState.PAUSED, "resumed", reopen=True)
        with real_lock(folder) as free:
            yield free

    monkeypatch.setattr(reconcile, "renting_lock", resumed_first)
    settled = await settle(runpod, ledger)
    assert not settled.run_ended and billing(runpod) == [row.instance_id]
    assert [r.state for r in ledger.rentals(run_id)] == [RentalState.LIVE]
