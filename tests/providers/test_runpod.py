"""RunPodProvider against the fake RunPod GraphQL API (in-process transport; one test over real HTTP and sshd)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncssh
import pytest

from desktop.services.providers.base import (
    AuthError,
    BidTooLowError,
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderError,
    RentRequest,
)
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.runpod import RunPodProvider, error_for
from tests.fakes.runpod import OUT_OF_STOCK, FakeRunPod

RETRY = RetryPolicy(first_delay=0.01)
IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"


@pytest.fixture(scope="module")
def client_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


@pytest.fixture
def public_key(client_key: asyncssh.SSHKey) -> str:
    return client_key.export_public_key().decode().strip()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRunPod]:
    cloud = FakeRunPod(tmp_path / "runpod", boot_seconds=0.2)
    yield cloud
    cloud.close()


@pytest.fixture
async def provider(fake: FakeRunPod) -> AsyncIterator[RunPodProvider]:
    client = RunPodProvider(fake.valid_key, transport=fake.transport(), retry=RETRY)
    yield client
    await client.aclose()


async def find_offer(provider: RunPodProvider, gpu: str, cloud: str, *, spot: bool = False, count: int = 1) -> Offer:
    offers = await provider.offers(OfferQuery(gpu=gpu, count=count, spot=spot))
    return next(o for o in offers if o.location.startswith(cloud))


def rent(offer: Offer, public_key: str, bid: float | None = None) -> RentRequest:
    return RentRequest(offer, public_key, "rentune-run1", IMAGE, disk_gb=40, bid_per_hour=bid)


async def wait_for(provider: RunPodProvider, pod_id: str, state: InstanceState) -> Instance:
    deadline = time.monotonic() + 15
    while True:
        instance = await provider.get(pod_id)
        if instance.state == state or time.monotonic() > deadline:
            return instance
        await asyncio.sleep(0.05)


# -- offers ----------------------------------------------------------------------------------------------------------


async def test_on_demand_offers_come_from_both_clouds(provider: RunPodProvider) -> None:
    offers = await provider.offers(OfferQuery(gpu="rtx 4090"))
    by_place = {o.location: o for o in offers}
    assert set(by_place) == {"secure cloud (US)", "community cloud (CA)"}
    secure = by_place["secure cloud (US)"]
    assert (secure.price_per_hour, secure.vram_gb, secure.count, secure.spot) == (0.69, 24.0, 1, False)
    assert secure.offer_id == "NVIDIA GeForce RTX 4090|SECURE|1"
    assert (secure.gpu, secure.gpu_id, secure.in_stock, secure.reliability) == (
        "RTX 4090",
        "NVIDIA GeForce RTX 4090",
        True,
        None,
    )
    assert by_place["community cloud (CA)"].price_per_hour == 0.44


async def test_spot_offers_price_the_minimum_bid_times_count(provider: RunPodProvider) -> None:
    offers = await provider.offers(OfferQuery(gpu="NVIDIA GeForce RTX 4090", count=2, spot=True))
    assert sorted((o.offer_id, o.price_per_hour, o.spot) for o in offers) == [
        ("NVIDIA GeForce RTX 4090|COMMUNITY|2", 0.58, True),
        ("NVIDIA GeForce RTX 4090|SECURE|2", 0.68, True),
    ]


async def test_out_of_stock_is_flagged_and_unsold_clouds_are_skipped(provider: RunPodProvider) -> None:
    offers = await provider.offers(OfferQuery(gpu="H100 SXM"))
    assert [(o.location, o.price_per_hour, o.in_stock) for o in offers] == [("secure cloud (US)", 2.99, False)]


async def test_filters_apply_to_vram_price_and_count(provider: RunPodProvider) -> None:
    big = await provider.offers(OfferQuery(min_vram_gb=80, max_price_per_hour=2.0))
    assert sorted((o.gpu, o.price_per_hour) for o in big) == [("A100 PCIe", 1.19), ("A100 PCIe", 1.64)]
    assert await provider.offers(OfferQuery(count=16)) == []  # more than any type's maxGpuCount


# -- create and watch ------------------------------------------------------------------------------------------------


async def test_create_on_demand_hands_over_the_key(provider: RunPodProvider, fake: FakeRunPod, public_key: str) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure")
    instance = await provider.create(rent(offer, public_key, bid=5.0))  # a bid on an on-demand offer is ignored
    assert (instance.state, instance.ssh, instance.spot, instance.price_per_hour) == (
        InstanceState.STARTING,
        None,
        False,
        0.69,
    )
    booked = fake.instances[instance.instance_id]
    assert booked.extra["mutation"] == "podFindAndDeployOnDemand"
    spec = booked.extra["input"]
    assert (spec["cloudType"], spec["gpuCount"], spec["containerDiskInGb"], spec["ports"]) == (
        "SECURE",
        1,
        40,
        "22/tcp",
    )
    assert (spec["name"], spec["imageName"], spec["startSsh"], spec["supportPublicIp"]) == ("rentune-run1", IMAGE, 1, 1)
    assert spec["env"] == [{"key": "PUBLIC_KEY", "value": public_key}]
    assert booked.public_key == public_key and "PUBLIC_KEY" not in booked.env
    assert booked.env["RUNPOD_POD_ID"] == instance.instance_id


async def test_create_spot_rents_interruptable_at_bid_per_gpu(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "community", spot=True, count=2)
    instance = await provider.create(rent(offer, public_key, bid=0.8))
    booked = fake.instances[instance.instance_id]
    assert booked.extra["mutation"] == "podRentInterruptable"
    assert booked.extra["input"]["bidPerGpu"] == 0.4
    assert booked.extra["input"]["cloudType"] == "COMMUNITY"
    assert booked.extra["input"]["env"] == [{"key": "PUBLIC_KEY", "value": public_key}]
    assert (instance.spot, instance.price_per_hour, instance.gpu) == (True, 0.8, "RTX 4090")


async def test_pod_starts_with_no_runtime_then_runs_with_the_sshd_port(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    created = await provider.create(rent(await find_offer(provider, "A100 PCIe", "secure"), public_key))
    starting = await provider.get(created.instance_id)
    assert (starting.state, starting.ssh, starting.status_text) == (InstanceState.STARTING, None, "RUNNING")
    running = await wait_for(provider, created.instance_id, InstanceState.RUNNING)
    address = fake.instances[created.instance_id].address
    assert running.state == InstanceState.RUNNING and address is not None
    assert running.ssh is not None and (running.ssh.host, running.ssh.port, running.ssh.user) == (
        "127.0.0.1",
        address.port,
        "root",
    )
    assert (running.name, running.gpu, running.price_per_hour) == ("rentune-run1", "A100 PCIe", 1.64)


async def test_unknown_pod_is_terminated(provider: RunPodProvider) -> None:
    assert (await provider.get("nope")).state == InstanceState.TERMINATED


# -- errors ----------------------------------------------------------------------------------------------------------


async def test_a_misspelt_field_is_refused_by_the_schema(provider: RunPodProvider) -> None:
    with pytest.raises(ProviderError, match="Cannot query field 'idd'") as caught:
        await provider.graphql("query { myself { idd } }")
    assert type(caught.value) is ProviderError


async def test_out_of_stock_create_keeps_runpods_message(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure")
    fake.faults.out_of_stock = True
    with pytest.raises(NoCapacityError) as caught:
        await provider.create(rent(offer, public_key))
    assert OUT_OF_STOCK in str(caught.value) and str(caught.value).startswith("RunPod: ")
    fake.faults.out_of_stock = False
    with pytest.raises(NoCapacityError):  # H100 has stockStatus null
        await provider.create(rent(await find_offer(provider, "H100 SXM", "secure"), public_key))
    assert fake.instances == {}


async def test_a_low_bid_is_refused(provider: RunPodProvider, fake: FakeRunPod, public_key: str) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure", spot=True)
    with pytest.raises(BidTooLowError, match="too low"):
        await provider.create(rent(offer, public_key, bid=0.10))
    fake.faults.bid_too_low = True
    with pytest.raises(BidTooLowError):
        await provider.create(rent(offer, public_key, bid=offer.price_per_hour))
    assert fake.instances == {}


async def test_a_429_is_retried(provider: RunPodProvider, fake: FakeRunPod) -> None:
    fake.faults.rate_limit_once = True
    await provider.check_key()
    assert len(fake.requests) == 2


async def test_a_refused_key_is_an_auth_error(fake: FakeRunPod, provider: RunPodProvider) -> None:
    wrong = RunPodProvider("wrong-key", transport=fake.transport(), retry=RETRY)
    try:
        with pytest.raises(AuthError):
            await wrong.check_key()
        with pytest.raises(AuthError):
            await wrong.offers(OfferQuery())
    finally:
        await wrong.aclose()
    await provider.check_key()
    fake.faults.reject_key = True
    with pytest.raises(AuthError, match="API key was refused"):
        await provider.check_key()


@pytest.mark.parametrize(
    ("errors", "kind"),
    [
        ([{"message": "Unauthorized"}], AuthError),
        ([{"message": "denied", "extensions": {"code": "UNAUTHENTICATED"}}], AuthError),
        ([{"message": "There are not enough free GPUs on the host machine to start this pod."}], NoCapacityError),
        ([{"message": "bid is below the minimum"}], BidTooLowError),
        ([{"message": "Something else broke"}], ProviderError),
        ([{"message": "Request failed with status code 401"}], AuthError),
        ([{"message": "pod x401 not found to terminate"}], ProviderError),
    ],
)
def test_error_messages_map_to_rentune_errors(errors: list[dict[str, object]], kind: type[ProviderError]) -> None:
    error = error_for(errors)
    assert type(error) is kind and str(errors[0]["message"]) in str(error)


# -- stop, terminate, list -------------------------------------------------------------------------------------------


async def test_terminate_is_idempotent_and_takes_the_machine(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    created = await provider.create(rent(await find_offer(provider, "RTX 4090", "secure"), public_key))
    await wait_for(provider, created.instance_id, InstanceState.RUNNING)
    assert fake.pool.alive(created.instance_id)
    await provider.terminate(created.instance_id)
    assert not fake.pool.alive(created.instance_id)
    assert (await provider.get(created.instance_id)).state == InstanceState.TERMINATED
    await provider.terminate(created.instance_id)  # "pod not found to terminate": already gone
    assert await provider.instances() == []


async def test_instances_lists_running_and_stopped_pods(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "community")
    first = await provider.create(rent(offer, public_key))
    second = await provider.create(RentRequest(offer, public_key, "rentune-run2", IMAGE))
    await provider.stop(second.instance_id)
    listed = {i.instance_id: i for i in await provider.instances()}
    assert set(listed) == {first.instance_id, second.instance_id}
    assert listed[second.instance_id].state == InstanceState.STOPPED
    assert listed[second.instance_id].name == "rentune-run2"
    assert listed[first.instance_id].state in (InstanceState.STARTING, InstanceState.RUNNING)


async def test_an_outbid_spot_pod_is_stopped(provider: RunPodProvider, fake: FakeRunPod, public_key: str) -> None:
    fake.faults.outbid_after = 0.0
    offer = await find_offer(provider, "RTX 4090", "secure", spot=True)
    created = await provider.create(rent(offer, public_key, bid=offer.price_per_hour))
    stopped = await wait_for(provider, created.instance_id, InstanceState.STOPPED)
    assert (stopped.state, stopped.ssh, stopped.spot, stopped.status_text) == (
        InstanceState.STOPPED,
        None,
        True,
        "EXITED",
    )
    assert fake.instances[created.instance_id].extra["outbid"] is True
    assert not fake.pool.alive(created.instance_id)


# -- real HTTP and a real machine ------------------------------------------------------------------------------------


async def test_a_pod_rented_over_http_lets_the_key_in_and_goes_away(
    fake: FakeRunPod, client_key: asyncssh.SSHKey, public_key: str
) -> None:
    client = RunPodProvider(fake.valid_key, fake.serve(), retry=RETRY)
    try:
        offer = await find_offer(client, "RTX 4090", "secure")
        created = await client.create(rent(offer, public_key))
        running = await wait_for(client, created.instance_id, InstanceState.RUNNING)
        address = fake.instances[created.instance_id].address
        assert running.ssh is not None and address is not None
        pin = f"[{running.ssh.host}]:{running.ssh.port} {address.host_public_key}"
        connect = {
            "host": running.ssh.host,
            "port": running.ssh.port,
            "username": address.user,  # the fake's machines log in as the test user, not root
            "client_keys": [client_key],
            "known_hosts": asyncssh.import_known_hosts(pin),
        }
        async with asyncssh.connect(**connect) as conn:
            result = await conn.run("echo ok", check=True)
        assert result.stdout == "ok\n"
        await client.terminate(created.instance_id)
        with pytest.raises(OSError):
            await asyncssh.connect(**connect, connect_timeout=5)
    finally:
        await client.aclose()
