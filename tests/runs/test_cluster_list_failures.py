"""Adoption by label while one of RunPod's lists fails: a pod whose create got no answer is adopted although
``GET /clusters`` fails (and a cluster although ``GET /pods`` does), and a create whose machine could be in the list
that failed is never taken for one that made nothing: it stays ``creating`` for the next start. The real RunPod
client on the fake RunPod, in process; no machine boots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from desktop.services.billing.ledger import Ledger, RentalState
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import OfferQuery, Provider, ProviderName, RentRequest
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.market import OpenProvider
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.renting.creating import CreateTiming, CreateUnsettledError, Creator
from desktop.services.renting.reconcile import settle_rentals
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.store import RunStore
from tests.fakes.http import CallFault, FaultKind
from tests.fakes.runpod import FakeRunPod

PODS = r"/v2/pods$"
CLUSTERS = r"/v2/clusters$"
LABEL = "rentune-0123abcd-20261205-101500-ab12"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample run"


@pytest.fixture
async def provider(fake_runpod: FakeRunPod) -> AsyncIterator[RunPodProvider]:
    fake_runpod.faults.never_ready = True
    client = RunPodProvider(
        fake_runpod.valid_key, transport=fake_runpod.transport(), retry=RetryPolicy(attempts=2, first_delay=0.01)
    )
    yield client
    await client.aclose()


async def no_wait(_seconds: float) -> None:
    await asyncio.sleep(0)


def creator(ledger: Ledger) -> Creator:
    timing = CreateTiming(answer_wait=2.0, lookups=2, lookup_delay=0.01, terminate_patience=10.0)
    return Creator(ledger, Terminator(ledger, sleep=no_wait), timing)


async def request_for(provider: RunPodProvider, nodes: int = 1) -> RentRequest:
    (offer, *_) = await provider.offers(OfferQuery(gpu="RTX 4090", count=1, nodes=nodes))
    return RentRequest(offer, KEY, LABEL, "runpod/pytorch")


def fresh(fake_runpod: FakeRunPod) -> OpenProvider:
    """Opens a new client at every start, as the app does (a failing list is asked once)."""

    def open_client(_name: ProviderName, _secrets: SecretStore | None) -> Provider:
        return RunPodProvider(fake_runpod.valid_key, transport=fake_runpod.transport(), retry=RetryPolicy(attempts=1))

    return open_client


async def test_a_pod_whose_create_got_no_answer_is_adopted_while_the_cluster_list_fails(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    ledger = Ledger()
    fake_runpod.failing_lists["clusters"] = 500
    fake_runpod.fail_next("POST", PODS, CallFault(FaultKind.TIMEOUT, after_acting=True))
    row, instance = await creator(ledger).create(provider, "run-1", await request_for(provider), 0.69)
    (pod,) = fake_runpod.instances.values()
    assert sum(1 for r in fake_runpod.requests if r.method == "POST") == 1, "the create went once"
    assert instance.instance_id == row.instance_id == pod.id and row.state is RentalState.LIVE


async def test_a_cluster_whose_create_got_no_answer_is_adopted_while_the_pod_list_fails(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    ledger = Ledger()
    fake_runpod.failing_lists["pods"] = 500
    fake_runpod.fail_next("POST", CLUSTERS, CallFault(FaultKind.TIMEOUT, after_acting=True))
    row, instance = await creator(ledger).create(provider, "run-2", await request_for(provider, nodes=2), 1.38)
    (book,) = fake_runpod.clusters.values()
    assert instance.instance_id == row.instance_id == f"cluster:{book.id}" and row.state is RentalState.LIVE


async def test_a_create_that_may_be_in_the_failed_list_stays_creating_until_the_next_start(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    """No answer, no pod, and the cluster list fails: nothing proves that nothing was made, so the row is not
    ``not_created``; the next start, with both lists read, settles it."""
    ledger = Ledger()
    fake_runpod.failing_lists["clusters"] = 500
    fake_runpod.fail_next("POST", PODS, CallFault(FaultKind.SERVER_ERROR, status=502))  # before acting: none made
    with pytest.raises(CreateUnsettledError, match="clusters could not be listed"):
        await creator(ledger).create(provider, "run-3", await request_for(provider), 0.69)
    (row,) = ledger.rentals("run-3")
    assert row.state is RentalState.CREATING and not fake_runpod.instances
    settled = await settle_rentals(RunStore(), ledger=ledger, open=fresh(fake_runpod))
    assert settled.not_created == [] and any("clusters could not be listed" in note for note in settled.notes)
    assert ledger.rentals("run-3")[0].state is RentalState.CREATING, "still unknown: left for the next start"
    fake_runpod.failing_lists.clear()
    settled = await settle_rentals(RunStore(), ledger=ledger, open=fresh(fake_runpod))
    assert [r.id for r in settled.not_created] == [row.id] and not ledger.unsettled()


async def test_the_next_start_adopts_and_ends_a_pod_while_the_cluster_list_fails(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    ledger = Ledger()
    request = await request_for(provider)
    ledger.intend("run-4", "runpod", LABEL, "RTX 4090", 0.69, request.offer.offer_id)
    made = await provider.create(request)  # it went out; the process died before recording the answer
    fake_runpod.failing_lists["clusters"] = 500
    settled = await settle_rentals(
        RunStore(), ledger=ledger, open=fresh(fake_runpod), terminator=Terminator(ledger, sleep=no_wait)
    )
    assert [r.instance_id for r in settled.adopted] == [made.instance_id]
    assert fake_runpod.instances[made.instance_id].terminated is not None and not ledger.unsettled()
