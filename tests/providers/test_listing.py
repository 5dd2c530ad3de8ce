"""One provider list failing hides nothing else: RunPod's pods and clusters are read apart, and a row a provider sends
that cannot be read (a Vast ``HostPort`` that is no number, a RunPod pod or a Lambda instance of the wrong shape) is
left out alone, named in a note. A look-up by label never answers "none" while what may hold the machine was left
out. The real clients against the fake clouds, in process; no machine boots."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from desktop.services.providers.base import OfferQuery, ProviderError, ProviderName, RentRequest
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.lambda_cloud import LambdaProvider, Pacer
from desktop.services.providers.listing import Listing, Unread, listed_apart, read_rows
from desktop.services.providers.runpod import RunPodProvider, instance_from
from desktop.services.providers.vast import VastProvider
from tests.fakes.lambda_cloud import FakeLambda, ManualClock
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast

FAST = RetryPolicy(attempts=2, first_delay=0.01)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ3bVm4sX9bW0xJ1sQvI6o4kz3wY5b2qfS1lDZ8J8yA rentune-test"
RUNPOD, VAST, LAMBDA = ProviderName.RUNPOD, ProviderName.VAST, ProviderName.LAMBDA


@pytest.fixture
async def runpod(fake_runpod: FakeRunPod) -> AsyncIterator[RunPodProvider]:
    fake_runpod.faults.never_ready = True
    client = RunPodProvider(fake_runpod.valid_key, transport=fake_runpod.transport(), retry=FAST)
    yield client
    await client.aclose()


@pytest.fixture
async def vast(fake_vast: FakeVast) -> AsyncIterator[VastProvider]:
    fake_vast.faults.never_ready = True
    client = VastProvider(fake_vast.valid_key, "http://vast.test/api/v0", transport=fake_vast.transport(), retry=FAST)
    yield client
    await client.aclose()


@pytest.fixture
def clock() -> ManualClock:
    """Lambda's limits on one clock for the fake and the client's pacer: the 12 s between launches pass at once."""
    return ManualClock()


@pytest.fixture
def fake_lambda(tmp_path: Path, clock: ManualClock) -> Iterator[FakeLambda]:
    cloud = FakeLambda(tmp_path / "fake-lambda", clock=clock.now)
    yield cloud
    cloud.close()


@pytest.fixture
async def lam(fake_lambda: FakeLambda, clock: ManualClock) -> AsyncIterator[LambdaProvider]:
    fake_lambda.faults.never_ready = True
    pacer = Pacer(clock=clock.now, sleep=clock.sleep)
    client = LambdaProvider(fake_lambda.valid_key, transport=fake_lambda.transport(), retry=FAST, pacer=pacer)
    yield client
    await client.aclose()


async def rent_pods(runpod: RunPodProvider, *labels: str) -> list[str]:
    offer = (await runpod.offers(OfferQuery(gpu="RTX 4090")))[0]
    return [(await runpod.create(RentRequest(offer, KEY, label, "img"))).instance_id for label in labels]


async def rent_cluster(runpod: RunPodProvider, label: str) -> str:
    (offer,) = await runpod.offers(OfferQuery(gpu="RTX 4090", count=1, nodes=2))
    return (await runpod.create(RentRequest(offer, KEY, label, "img"))).instance_id


# -- RunPod: pods and clusters apart --------------------------------------------------------------------------------


async def test_a_failed_cluster_list_still_lists_the_pods_with_a_note(
    runpod: RunPodProvider, fake_runpod: FakeRunPod
) -> None:
    pods = await rent_pods(runpod, "rentune-a", "rentune-b")
    await rent_cluster(runpod, "rentune-c")
    fake_runpod.failing_lists["clusters"] = 500
    listing = await runpod.listing()
    assert sorted(i.instance_id for i in listing.instances) == sorted(pods), "every pod, no cluster"
    (note,) = listing.notes
    assert note.startswith("RunPod: clusters could not be listed (server error 500") and "listed without them" in note
    assert sorted(i.instance_id for i in await runpod.instances()) == sorted(pods)


async def test_a_pod_is_found_by_its_label_while_the_cluster_list_fails(
    runpod: RunPodProvider, fake_runpod: FakeRunPod
) -> None:
    (pod,) = await rent_pods(runpod, "rentune-a")
    fake_runpod.failing_lists["clusters"] = 503
    assert [i.instance_id for i in await runpod.named("rentune-a")] == [pod]


async def test_a_cluster_is_found_by_its_label_while_the_pod_list_fails(
    runpod: RunPodProvider, fake_runpod: FakeRunPod
) -> None:
    cluster = await rent_cluster(runpod, "rentune-c")
    fake_runpod.failing_lists["pods"] = 500
    assert [i.instance_id for i in await runpod.named("rentune-c")] == [cluster]


async def test_no_machine_found_while_a_list_failed_is_not_none(
    runpod: RunPodProvider, fake_runpod: FakeRunPod
) -> None:
    await rent_pods(runpod, "rentune-a")
    fake_runpod.failing_lists["clusters"] = 500
    with pytest.raises(ProviderError, match="no machine named rentune-x among those that could be read") as caught:
        await runpod.named("rentune-x")
    assert "clusters could not be listed" in caught.value.message
    fake_runpod.failing_lists.clear()
    assert await runpod.named("rentune-x") == [], "with both lists read, none is none"


async def test_both_lists_failing_fails_the_listing(runpod: RunPodProvider, fake_runpod: FakeRunPod) -> None:
    fake_runpod.failing_lists.update(pods=500, clusters=500)
    with pytest.raises(ProviderError, match="server error 500"):
        await runpod.listing()


async def test_one_unreadable_pod_leaves_out_that_pod_alone(runpod: RunPodProvider, fake_runpod: FakeRunPod) -> None:
    good, bad = await rent_pods(runpod, "rentune-a", "rentune-b")
    fake_runpod.malform(bad, gpu="RTX 4090")  # a string where v2 sends an object
    listing = await runpod.listing()
    assert [i.instance_id for i in listing.instances] == [good]
    (note,) = listing.notes
    assert note.startswith(f"RunPod: pod {bad} (rentune-b) could not be read (")
    assert "'str' object has no attribute 'get'" in note
    with pytest.raises(ProviderError, match=f"pod {bad} \\(rentune-b\\)"):
        await runpod.named("rentune-b")  # it may be that machine: not "none"
    assert await runpod.named("rentune-z") == [], "a row named otherwise cannot be rentune-z"


async def test_one_unreadable_cluster_leaves_out_that_cluster_alone(
    runpod: RunPodProvider, fake_runpod: FakeRunPod
) -> None:
    (pod,) = await rent_pods(runpod, "rentune-a")
    cluster = await rent_cluster(runpod, "rentune-c")
    fake_runpod.malform(cluster.removeprefix("cluster:"), pods={"total": "two", "byStatus": {}})
    listing = await runpod.listing()
    assert [i.instance_id for i in listing.instances] == [pod]
    (note,) = listing.notes
    assert f"RunPod: cluster {cluster.removeprefix('cluster:')} (rentune-c) could not be read" in note
    assert "'two'" in note


# -- Vast.ai and Lambda: one row alone --------------------------------------------------------------------------------


async def test_a_vast_instance_whose_host_port_is_no_number_hides_no_other(
    vast: VastProvider, fake_vast: FakeVast
) -> None:
    offer = (await vast.offers(OfferQuery(gpu="RTX 4090")))[0]
    made = [(await vast.create(RentRequest(offer, KEY, f"rentune-{n}", "img"))).instance_id for n in "abc"]
    running = {"actual_status": "running", "intended_status": "running", "public_ipaddr": "127.0.0.1"}
    fake_vast.malform(made[1], **running, ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "abc"}]})
    listing = await vast.listing()
    assert [i.instance_id for i in listing.instances] == [made[0], made[2]]
    assert listing.notes == [
        f"Vast.ai: instance {made[1]} (rentune-b) could not be read (invalid literal for int() with base 10: 'abc')"
    ]
    with pytest.raises(ProviderError, match="rentune-b"):
        await vast.named("rentune-b")
    assert [i.instance_id for i in await vast.named("rentune-c")] == [made[2]]


async def test_a_lambda_instance_of_the_wrong_shape_hides_no_other(
    lam: LambdaProvider, fake_lambda: FakeLambda
) -> None:
    offer = (await lam.offers(OfferQuery(gpu="A10")))[0]
    first = (await lam.create(RentRequest(offer, KEY, "rentune-a", "img"))).instance_id
    second = (await lam.create(RentRequest(offer, KEY, "rentune-b", "img"))).instance_id
    fake_lambda.malform(first, instance_type={"name": "gpu_1x_a10", "price_cents_per_hour": "n/a"})
    listing = await lam.listing()
    assert [i.instance_id for i in listing.instances] == [second]
    (note,) = listing.notes
    assert note == (
        f"Lambda: instance {first} (rentune-a) could not be read (could not convert string to float: 'n/a')"
    )


# -- the shared parts -----------------------------------------------------------------------------------------------


def test_rows_without_an_id_or_not_objects_are_named_too() -> None:
    good = {"id": "p1", "name": "rentune-a", "status": "RUNNING"}
    listing = read_rows(RUNPOD, "pod", [good, {"name": "rentune-b"}, "junk"], instance_from)
    assert [i.instance_id for i in listing.instances] == ["p1"]
    assert listing.notes == [
        "RunPod: a pod without an id (rentune-b) could not be read (no id)",
        "RunPod: a pod that is not an object ('junk') could not be read (not a JSON object)",
    ]
    assert [u.name for u in listing.unread] == ["rentune-b", None]


async def test_a_part_that_fails_is_a_note_and_all_failing_raise_the_first() -> None:
    async def fine() -> Listing:
        return Listing(RUNPOD, unread=[Unread("a row", "rentune-a")])

    async def broken() -> Listing:
        raise ProviderError(RUNPOD, "down")

    listing = await listed_apart(RUNPOD, {"pods": fine, "clusters": broken})
    assert listing.notes == ["a row", "RunPod: clusters could not be listed (down); the rest is listed without them"]
    with pytest.raises(ProviderError, match="down"):
        await listed_apart(RUNPOD, {"pods": broken, "clusters": broken})
