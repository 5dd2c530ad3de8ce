"""Money safety of renting under injected faults: every machine recorded before its create, never created twice,
terminated until gone, held to its budget in every phase, and booked to the provider's own times."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.core.runs.labels import parse_label
from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger, RentalState
from desktop.services.providers.base import InstanceState, ProviderError, ProviderName, RentRequest
from desktop.services.renting import driver as rental
from desktop.services.renting.reconcile import settle_rentals
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fakes.memory_cloud import Fault, MemoryCloud, offer
from tests.runs.rental_world import (
    World,
    checkpoint_then_keep_training,
    ssh_always_greets,  # noqa: F401 - autouse: machines greet at once
    trains_to_the_end,
)


def finishes(cloud: MemoryCloud) -> None:
    cloud.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)


def assert_books_balance(world: World, cloud: MemoryCloud, run_id: str) -> None:
    """Each rental's dollars equal the cloud's billed seconds times the price (within 1 %)."""
    for row in world.ledger.rentals(run_id):
        if row.instance_id is None or row.provider != cloud.name.value:
            continue
        billed = cloud.billed_seconds(row.instance_id) * row.price_per_hour / 3600
        assert row.usd(cloud.clock()) == pytest.approx(billed, rel=0.01, abs=1e-9)


async def test_a_create_that_made_a_machine_but_got_no_answer_is_adopted_not_sent_again(tmp_path: Path) -> None:
    world = World(tmp_path)
    finishes(world.runpod)
    world.runpod.fail("create", Fault("uncertain", after_acting=True))
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    assert len(world.runpod.requests) == 1, "the create was never sent twice"
    [row] = world.ledger.rentals(run_id)
    assert row.state is RentalState.ENDED and row.instance_id == "runpod-1"
    assert world.runpod.live() == []
    assert_books_balance(world, world.runpod, run_id)


async def test_a_machine_adopted_after_an_unclear_create_bills_from_when_the_create_went_out(tmp_path: Path) -> None:
    """Lambda reports no start time: the ledger starts when the create was sent, not when the rental was recorded
    (a key upload may come between) nor when the lookup found the machine."""
    world = World(tmp_path)
    finishes(world.runpod)
    world.runpod.reports_start_times = False
    world.runpod.fail("create", Fault("uncertain", after_acting=True, delay=0.5))
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    [row] = world.ledger.rentals(run_id)
    billed_from = world.runpod.billed[row.instance_id or ""][0]
    assert billed_from - 0.05 <= row.started <= billed_from


async def test_a_create_with_no_answer_and_no_machine_is_not_created_and_the_next_offer_is_tried(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.runpod._offers = [offer(ProviderName.RUNPOD, "a", 0.20), offer(ProviderName.RUNPOD, "b", 0.30)]
    finishes(world.runpod)
    world.runpod.fail("create", Fault("uncertain", after_acting=False))
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    rows = world.ledger.rentals(run_id)
    assert [r.state for r in rows] == [RentalState.NOT_CREATED, RentalState.ENDED]
    assert rows[0].usd(1e12) == 0.0 and rows[0].offer_id == "a" and parse_label(rows[0].label) is not None


async def test_the_rental_is_recorded_before_the_create_request(tmp_path: Path) -> None:
    world = World(tmp_path)
    finishes(world.runpod)
    seen: list[list[RentalState]] = []
    create = world.runpod.create

    async def checking(request: RentRequest) -> object:
        seen.append([r.state for r in Ledger().rentals() if r.label == request.label])
        return await create(request)

    world.runpod.create = checking  # type: ignore[method-assign]
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED
    assert seen == [[RentalState.CREATING]]


async def test_cancelling_during_a_create_terminates_what_it_made(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.runpod.hold_creates = asyncio.Event()
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    while not world.runpod.creates_held:  # the create reached the provider (a loaded machine may take a while)
        await asyncio.sleep(0.01)
    assert world.ledger.rentals(run_id), "recorded before the create request"
    drive.cancel()  # Ctrl-C while the provider is still making the machine
    await asyncio.sleep(0.05)
    world.runpod.hold_creates.set()  # ... and then it does
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(drive, 30)
    [row] = world.ledger.rentals(run_id)
    assert world.runpod.terminated == ["runpod-1"] and world.runpod.live() == []
    assert row.state is RentalState.ENDED and row.instance_id == "runpod-1"


async def test_a_terminate_that_keeps_failing_leaves_the_rental_terminating_until_a_later_start_ends_it(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    finishes(world.runpod)
    world.runpod.fail("terminate", *[Fault("refused")] * 10_000)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED, "the run ends: the adapter is home"
    [row] = world.ledger.rentals(run_id)
    assert row.state is RentalState.TERMINATING and row.running, "it still counts as billing"
    assert any("is not terminated yet" in line and "keeps terminating it" in line for line in world.lines)
    assert world.engine.store.get(run_id).spec["rental"] is None, "no run is left pointing at it"
    world.runpod.faults.clear()  # the provider recovers; the next start settles it
    settled = await settle_rentals(RunStore(), ledger=world.ledger, open=lambda n, _s: world.clouds[n])
    [row] = world.ledger.rentals(run_id)
    assert row.state is RentalState.ENDED and world.runpod.live() == []
    assert settled.terminated and not row.end_estimated, "booked to the provider's own end time"
    assert_books_balance(world, world.runpod, run_id)


async def test_a_create_left_unanswered_by_a_killed_process_is_settled_at_the_next_start(tmp_path: Path) -> None:
    world = World(tmp_path)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    made = world.ledger.intend(run_id, "runpod", "rentune-0123abcd-" + run_id, "RTX 4090", 0.30, "rp-1")
    await world.runpod.create(RentRequest(world.runpod._offers[0], "ssh-ed25519 AAAA", made.label, "img"))
    lost = world.ledger.intend(run_id, "vast", "rentune-0123abcd-" + run_id, "RTX 4090", 0.25, "va-1")
    settled = await settle_rentals(RunStore(), ledger=world.ledger, open=lambda n, _s: world.clouds[n])
    assert [r.instance_id for r in settled.adopted] == ["runpod-1"] and world.runpod.live() == []
    assert world.ledger.row(made.id).state is RentalState.ENDED
    assert world.ledger.row(lost.id).state is RentalState.NOT_CREATED
    assert_books_balance(world, world.runpod, run_id)


async def test_a_create_left_unanswered_never_adopts_an_earlier_machine_of_its_run(tmp_path: Path) -> None:
    """Every machine of a run has the run's label: the lookup of a later create finds the earlier machine too (still
    live, here). It is its own row's; the create that made nothing is not_created, and nothing crashes."""
    world = World(tmp_path)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    label = "rentune-0123abcd-" + run_id
    earlier = world.ledger.intend(run_id, "runpod", label, "RTX 4090", 0.30, "rp-1")
    made = await world.runpod.create(RentRequest(world.runpod._offers[0], "ssh-ed25519 AAAA", label, "img"))
    world.ledger.created(earlier.id, made.instance_id)
    lost = world.ledger.intend(run_id, "runpod", label, "RTX 4090", 0.30, "rp-1")
    settled = await settle_rentals(RunStore(), ledger=world.ledger, open=lambda n, _s: world.clouds[n])
    assert settled.adopted == [] and [r.id for r in settled.not_created] == [lost.id]
    assert world.ledger.row(lost.id).state is RentalState.NOT_CREATED
    assert world.ledger.row(earlier.id).state is RentalState.LIVE and world.runpod.live() != []


async def test_an_unclear_create_never_adopts_an_earlier_machine_of_its_run(tmp_path: Path) -> None:
    from desktop.services.renting.creating import CreateTiming, Creator
    from desktop.services.renting.terminator import Terminator

    world = World(tmp_path)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    request = RentRequest(world.runpod._offers[0], "ssh-ed25519 AAAA", "rentune-0123abcd-" + run_id, "img")
    creator = Creator(world.ledger, Terminator(world.ledger), CreateTiming(lookups=1, lookup_delay=0.0))
    first, _machine = await creator.create(world.runpod, run_id, request, 0.30)
    world.runpod.fail("create", Fault("uncertain"))  # refused before acting, but the answer is unclear
    with pytest.raises(ProviderError, match="no machine named"):
        await creator.create(world.runpod, run_id, request, 0.30)
    assert [r.state for r in world.ledger.rentals(run_id)] == [RentalState.LIVE, RentalState.NOT_CREATED]
    assert world.ledger.row(first.id).instance_id == "runpod-1"


async def test_settling_skips_a_run_another_process_is_renting_for(tmp_path: Path) -> None:
    world = World(tmp_path)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    world.ledger.intend(run_id, "runpod", "rentune-0123abcd-" + run_id, "RTX 4090", 0.30, "rp-1")
    import filelock

    held = filelock.FileLock(world.engine.folder(run_id) / ".renting.lock")
    held.acquire()
    try:
        settled = await settle_rentals(RunStore(), ledger=world.ledger, open=lambda n, _s: world.clouds[n])
    finally:
        held.release()
    assert len(settled.busy) == 1 and world.ledger.unsettled()[0].state is RentalState.CREATING


async def test_the_budget_holds_while_the_machine_is_still_coming_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def silent(_host: str, _port: int, time_limit: float = 5.0) -> bool:
        return False  # SSH never answers: the run would wait its whole ready timeout

    monkeypatch.setattr(rental, "ssh_banner", silent)
    world = World(tmp_path)
    world.runpod._offers = [offer(ProviderName.RUNPOD, "dear", 360.0)]  # $0.10 a second
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True), budget=18.3)  # the stop costs $18
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FAILED
    assert "would be crossed before training started" in str(final.error)
    assert world.runpod.live() == [] and world.runpod.terminated == ["runpod-1"]
    [row] = world.ledger.rentals(run_id)
    assert row.usd(row.stopped or 0) < 18.3


async def test_a_preempted_machine_is_booked_to_the_providers_end_time(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", checkpoint_then_keep_training)
    finishes(world.vast)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True, providers=("vast",)))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    while not list(world.engine.folder(run_id).glob("checkpoints/checkpoint-2")):
        await asyncio.sleep(0.01)
    world.runpod.take_away("runpod-1", InstanceState.STOPPED)
    world.runpod._offers = []
    preempted_at = world.runpod.billed["runpod-1"][1]
    final = await asyncio.wait_for(drive, 30)
    assert final.state is RunState.FINISHED, final.error
    first = world.ledger.get("runpod", "runpod-1")
    assert first is not None and first.stopped == preempted_at and not first.end_estimated
    assert_books_balance(world, world.runpod, run_id)
    assert_books_balance(world, world.vast, run_id)


async def test_a_preempted_machine_its_provider_forgets_once_terminated_is_booked_to_the_end_it_reported(
    tmp_path: Path,
) -> None:
    """The provider gives the end time only while the machine is stopped; once terminated it no longer knows the
    machine (as RunPod answers 404 for a deleted pod): the driver keeps the end it saw when it found the machine
    lost."""
    world = World(tmp_path)
    world.runpod.on_create = lambda host: setattr(host, "on_launch", checkpoint_then_keep_training)
    finishes(world.vast)
    terminate = world.runpod.terminate

    async def terminate_and_forget(instance_id: str) -> None:
        await terminate(instance_id)
        world.runpod.instances.pop(instance_id, None)

    world.runpod.terminate = terminate_and_forget  # type: ignore[method-assign]
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True, providers=("vast",)))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    while not list(world.engine.folder(run_id).glob("checkpoints/checkpoint-2")):
        await asyncio.sleep(0.01)
    world.runpod.take_away("runpod-1", InstanceState.STOPPED)
    world.runpod._offers = []
    preempted_at = world.runpod.billed["runpod-1"][1]
    final = await asyncio.wait_for(drive, 30)
    assert final.state is RunState.FINISHED, final.error
    first = world.ledger.get("runpod", "runpod-1")
    assert first is not None and first.stopped == preempted_at and not first.end_estimated
    assert_books_balance(world, world.runpod, run_id)


async def test_the_self_stop_heartbeat_is_kept_while_the_adapter_is_pulled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from desktop.services.runs import checkpoints, self_stop
    from desktop.services.runs import engine as engine_module

    monkeypatch.setattr(engine_module, "PULL_HEARTBEAT_POLL_S", 0.01)
    monkeypatch.setattr(self_stop, "HEARTBEAT_SECONDS", 0.0)
    world = World(tmp_path)
    finishes(world.runpod)
    during: list[int] = []
    real_pull = checkpoints.pull_adapter

    async def slow_pull(*args: object) -> Path:
        [host] = world.hosts.values()
        before = sum("HEARTBEAT" in c for c in host.commands)
        await asyncio.sleep(0.3)  # a long adapter download
        during.append(sum("HEARTBEAT" in c for c in host.commands) - before)
        return await real_pull(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoints, "pull_adapter", slow_pull)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True, self_stop_minutes=30))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    assert during and during[0] >= 3, "the heartbeat was touched while the adapter came home"


async def test_the_idle_guard_counts_transfer_bytes_and_never_fires_during_the_final_pull(tmp_path: Path) -> None:
    import time

    from desktop.services.billing.activity import mark_activity
    from desktop.services.billing.rentals import Rental

    world = World(tmp_path)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    store = world.engine.store
    store.transition(run_id, RunState.PROVISIONING)
    long_ago = time.time() - 3600
    rented = Rental(ProviderName.RUNPOD, "pod-1", "RTX 4090", 0.3, True, "rp-1", long_ago, long_ago)
    store.update(run_id, started=long_ago)
    import sqlite3

    with sqlite3.connect(store.path) as db:  # every state change an hour ago
        db.execute("UPDATE transitions SET ts = ? WHERE run_id = ?", (long_ago, run_id))
    assert world.driver._idle_seconds(run_id, rented) > 3500
    mark_activity(world.engine.folder(run_id))  # bytes of an upload moved just now
    assert world.driver._idle_seconds(run_id, rented) < 60


async def test_a_refused_login_is_named_as_such_not_waited_out_as_a_machine_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncssh

    monkeypatch.setattr(rental, "REFUSED_LOGIN_GRACE_S", 0.1)
    world = World(tmp_path)
    world.runpod.on_create = lambda host: host.connect_failures.extend(
        [asyncssh.PermissionDenied("permission denied (publickey)")] * 10_000
    )
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.FAILED
    assert "refuses the run's key for root" in str(final.error) and "not ready" not in str(final.error)
    assert world.runpod.live() == []


async def test_a_final_pull_cut_short_by_a_dead_driver_is_finished_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from desktop.services.runs import checkpoints

    world = World(tmp_path)
    finishes(world.runpod)
    real_pull = checkpoints.pull_adapter

    async def never_ends(*_args: object) -> Path:
        await asyncio.Event().wait()  # the driver dies while the adapter is on its way
        raise AssertionError

    monkeypatch.setattr(checkpoints, "pull_adapter", never_ends)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))
    first = asyncio.ensure_future(world.driver.drive(run_id))
    while world.engine.store.get(run_id).state is not RunState.PULLING:
        await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    monkeypatch.setattr(checkpoints, "pull_adapter", real_pull)
    final = await asyncio.wait_for(World(tmp_path).driver_for(world).drive(run_id), 30)
    assert final.state is RunState.FINISHED, final.error
    assert world.runpod.live() == []


async def test_the_budget_stops_a_training_run_before_it_is_crossed_and_terminates(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.runpod._offers = [offer(ProviderName.RUNPOD, "dear", 3600.0)]  # $1 a second: stopping costs $189
    world.runpod.on_create = lambda host: setattr(host, "on_launch", checkpoint_then_keep_training)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True), budget=191.0)  # 2 s of renting
    final = await asyncio.wait_for(world.driver.drive(run_id), 30)
    assert final.state is RunState.CANCELLED and "budget of $191.00 reached" in str(final.error), final.error
    assert world.runpod.live() == [] and world.runpod.terminated == ["runpod-1"]
    assert any(e["event"] == "checkpoint" for e in mirrored_events(world.engine.folder(run_id)))
    [row] = world.ledger.rentals(run_id)
    assert row.usd(row.stopped or 0) < 191.0
    assert_books_balance(world, world.runpod, run_id)
