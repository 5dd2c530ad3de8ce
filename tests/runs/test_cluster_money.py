"""Money safety of a rented cluster under injected faults, with the real RunPod client and the fake RunPod (its
/v2/clusters, members booting real sshds): recorded before its create, never created twice, adopted by its label
after an answer that never came, terminated until gone when deletes fail, and what a killed create made is deleted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.services.billing.ledger import Ledger, RentalState
from desktop.services.providers.base import OfferQuery, RentRequest
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.renting.creating import CreateTiming, Creator
from desktop.services.renting.terminator import Terminator
from tests.fakes.http import CallFault, FaultKind
from tests.fakes.runpod import FakeRunPod
from tests.fakes.runpod_clusters import booked_as_billed


@pytest.fixture
def provider(runpod_client: RunPodProvider) -> RunPodProvider:
    """The real RunPod client on the shared fake (tests/conftest.py's ``runpod_client``)."""
    return runpod_client


CLUSTERS = r"/v2/clusters$"
#: Seconds a cluster bills before its end in the dollar checks: past their 1 s tolerance, so a cluster booked at $0
#: cannot pass.
BILLED_PAST_TOLERANCE_S = 1.5
LABEL = "rentune-0123abcd-20261205-101500-ab12"


async def no_wait(_seconds: float) -> None:
    await asyncio.sleep(0)


def creator(ledger: Ledger) -> Creator:
    timing = CreateTiming(answer_wait=2.0, lookups=2, lookup_delay=0.05, terminate_patience=10.0)
    return Creator(ledger, Terminator(ledger, sleep=no_wait), timing)


async def cluster_request(provider: RunPodProvider) -> RentRequest:
    (offer,) = await provider.offers(OfferQuery(gpu="RTX 4090", count=1, nodes=2))
    return RentRequest(offer, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample run", LABEL, "runpod/pytorch")


def posts(fake_runpod: FakeRunPod) -> int:
    return sum(1 for r in fake_runpod.requests if r.method == "POST" and r.path == "/v2/clusters")


async def test_a_cluster_whose_create_got_no_answer_is_adopted_by_its_label_not_created_again(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    ledger = Ledger()
    fake_runpod.fail_next("POST", CLUSTERS, CallFault(FaultKind.TIMEOUT, after_acting=True))
    row, instance = await creator(ledger).create(provider, "run-1", await cluster_request(provider), 1.38)
    (book,) = fake_runpod.clusters.values()
    assert posts(fake_runpod) == 1, "the create went once"
    assert instance.instance_id == row.instance_id == f"cluster:{book.id}" and row.state is RentalState.LIVE
    await asyncio.sleep(BILLED_PAST_TOLERANCE_S)
    assert await Terminator(ledger, sleep=no_wait).until_gone(provider, instance.instance_id)
    assert book.deleted is not None and not fake_runpod.pool.servers
    rows = ledger.rentals("run-1")
    assert [(r.node, r.instance_id, r.state) for r in rows] == [
        (rank, f"cluster:{book.id}/{rank}", RentalState.ENDED) for rank in range(2)
    ], "one rental per machine of the cluster"
    for rental, billed in zip(rows, fake_runpod.members_billed(book.id), strict=True):
        assert rental.stopped is not None
        gap = booked_as_billed(rental.usd(rental.stopped), billed)
        assert gap is None, gap


def test_a_cluster_is_one_rental_per_machine_and_one_machine_to_its_provider(tmp_path: Path) -> None:
    """Each machine has its row and its share of the price; the provider's calls by the cluster's id act on them all."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    intent = ledger.intend("run-5", "runpod", LABEL, "8x H100 SXM", 40.0, "H100|CLUSTER|8|2", nodes=2)
    assert intent.instance_id is None and intent.price_per_hour == 40.0 and intent.gpu == "2 machines x 8x H100 SXM"
    assert [(r.node, r.gpu, r.price_per_hour, r.state) for r in ledger.rentals("run-5")] == [
        (0, "8x H100 SXM, machine 1 of 2", 20.0, RentalState.CREATING),
        (1, "8x H100 SXM, machine 2 of 2", 20.0, RentalState.CREATING),
    ]
    made = ledger.created(intent.id, "cluster:c1", price_per_hour=41.0, started=1000.0)
    assert (made.instance_id, made.price_per_hour, made.state) == ("cluster:c1", 41.0, RentalState.LIVE)
    assert [r.price_per_hour for r in ledger.rentals("run-5")] == [20.5, 20.5]
    assert [r.instance_id for r in ledger.machines("run-5")] == ["cluster:c1"]
    ledger.terminating("runpod", "cluster:c1")
    assert [r.state for r in ledger.unsettled()] == [RentalState.TERMINATING], "settled as one"
    ledger.close("runpod", "cluster:c1", 1000.0 + 3600, estimated=False)
    assert [(r.state, r.usd(9e9)) for r in ledger.rentals("run-5")] == [(RentalState.ENDED, 20.5)] * 2
    gone = ledger.get("runpod", "cluster:c1")
    assert gone is not None and gone.usd(9e9) == 41.0 and ledger.summary(9e9).total_usd == 41.0
    refused = ledger.intend("run-6", "runpod", LABEL, "8x H100 SXM", 40.0, nodes=3)
    ledger.not_created(refused.id)
    assert {r.state for r in ledger.rentals("run-6")} == {RentalState.NOT_CREATED} and not ledger.unsettled()


async def test_the_rental_is_in_the_ledger_before_the_cluster_create_goes_out(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    ledger = Ledger()
    seen: list[list[RentalState]] = []
    original = fake_runpod.dispatch

    def recording(request):  # type: ignore[no-untyped-def]
        if request.method == "POST" and request.path == "/v2/clusters":
            seen.append([(row.node, row.state) for row in ledger.rentals("run-2")])
        return original(request)

    fake_runpod.dispatch = recording  # type: ignore[method-assign]
    await creator(ledger).create(provider, "run-2", await cluster_request(provider), 1.38)
    assert seen == [[(0, RentalState.CREATING), (1, RentalState.CREATING)]], "each machine recorded before the create"


async def test_a_create_killed_midway_has_its_cluster_deleted_and_booked(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    ledger = Ledger()
    fake_runpod.fail_next("POST", CLUSTERS, CallFault(FaultKind.SLOW, delay=1.0))
    task = asyncio.ensure_future(creator(ledger).create(provider, "run-3", await cluster_request(provider), 1.38))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake_runpod.clusters, "the create went out and made a cluster after the cancel"
    assert all(book.deleted is not None for book in fake_runpod.clusters.values()), "what the create made is deleted"
    assert posts(fake_runpod) == 1
    for row in ledger.rentals("run-3"):
        assert row.state in {RentalState.ENDED, RentalState.NOT_CREATED}


async def test_deletes_that_fail_are_retried_until_runpod_says_the_cluster_is_gone(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    ledger = Ledger()
    _row, instance = await creator(ledger).create(provider, "run-4", await cluster_request(provider), 1.38)
    fake_runpod.faults.failing_terminates = 3
    assert await Terminator(ledger, sleep=no_wait).until_gone(provider, instance.instance_id)
    (book,) = fake_runpod.clusters.values()
    assert book.deleted is not None and not fake_runpod.pool.servers
    assert [r.state for r in ledger.rentals("run-4")] == [RentalState.ENDED] * 2


async def test_a_cluster_a_killed_process_created_without_recording_it_is_deleted_at_the_next_start(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    """The process died between the create and its answer: every machine's row is still creating. The next start
    finds the cluster by its label, deletes it (every machine) and books each machine's time."""
    from desktop.services.renting.reconcile import settle_rentals
    from desktop.services.runs.store import RunStore

    ledger = Ledger()
    request = await cluster_request(provider)
    offer = request.offer
    intent = ledger.intend("run-8", "runpod", LABEL, "1x RTX 4090", offer.price_per_hour, offer.offer_id, nodes=2)
    await provider.create(request)  # it went out; nothing recorded its answer
    await asyncio.sleep(BILLED_PAST_TOLERANCE_S)

    def fresh_client(_name: object, _secrets: object) -> RunPodProvider:
        return RunPodProvider(fake_runpod.valid_key, transport=fake_runpod.transport())

    settled = await settle_rentals(
        RunStore(), ledger=ledger, open=fresh_client, terminator=Terminator(ledger, sleep=no_wait)
    )
    (book,) = fake_runpod.clusters.values()
    assert [r.instance_id for r in settled.adopted] == [f"cluster:{book.id}"], "found by its label, as one"
    assert book.deleted is not None and not fake_runpod.pool.servers
    rows = ledger.rentals("run-8")
    assert [(r.id, r.state) for r in rows] == [(intent.id, RentalState.ENDED), (intent.id + 1, RentalState.ENDED)]
    for rental, billed in zip(rows, fake_runpod.members_billed(book.id), strict=True):
        assert rental.stopped is not None
        gap = booked_as_billed(rental.usd(rental.stopped), billed)
        assert gap is None, gap
    assert not ledger.unsettled()
