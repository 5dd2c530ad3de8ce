"""The Vast.ai client against the fake Vast API: offers, renting (on-demand, bids), states, faults, a real machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncssh
import pytest

from desktop.services.providers.base import (
    AuthError,
    BidTooLowError,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderError,
    ProviderName,
    RentRequest,
)
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.registry import open_provider
from desktop.services.providers.vast import VastProvider, instance_state
from tests.fakes.vast import FakeVast

FAST = RetryPolicy(first_delay=0.01)


@pytest.fixture
async def vast(fake_vast: FakeVast) -> AsyncIterator[VastProvider]:
    provider = VastProvider("test-key", "http://vast.test/api/v0", transport=fake_vast.transport(), retry=FAST)
    yield provider
    await provider.aclose()


@pytest.fixture(scope="module")
def key_pair() -> tuple[asyncssh.SSHKey, str]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key, key.export_public_key().decode().strip()


def bodies(fake: FakeVast, method: str, path_part: str) -> list[Any]:
    return [r.json() for r in fake.requests if r.method == method and path_part in r.path]


def request_for(offer: Offer, public_key: str, bid: float | None = None) -> RentRequest:
    return RentRequest(offer, public_key, "rentune-run1", "pytorch/pytorch:latest", disk_gb=40, bid_per_hour=bid)


async def cheapest(vast: VastProvider, gpu: str = "RTX 4090", *, spot: bool = False) -> Offer:
    return (await vast.offers(OfferQuery(gpu=gpu, spot=spot)))[0]


def boot_now(fake: FakeVast, instance_id: str) -> None:
    fake.instances[instance_id].created -= 60  # as if the boot time had passed


# -- offers ---------------------------------------------------------------------------------------------------------


async def test_on_demand_offers_are_mapped_and_filtered_by_vast(vast: VastProvider, fake_vast: FakeVast) -> None:
    offers = await vast.offers(OfferQuery())

    assert [o.offer_id for o in offers] == ["5001", "5002", "5003"]  # cheapest first; unverified and old CUDA dropped
    rtx = offers[0]
    assert (rtx.gpu, rtx.gpu_id, rtx.count, rtx.vram_gb) == ("RTX 4090", "RTX 4090", 1, 24.0)  # 24564 MB
    assert (rtx.price_per_hour, rtx.spot, rtx.reliability, rtx.location, rtx.in_stock) == (
        0.40,
        False,
        0.99,
        "Oslo, NO",
        True,
    )
    assert offers[2].reliability == 0.81 and offers[2].location == "" and offers[2].vram_gb == 80.0
    body = bodies(fake_vast, "POST", "/bundles/")[0]
    assert body["type"] == "on-demand" and body["limit"] == 200 and body["order"] == [["dph_total", "asc"]]
    assert body["verified"] == {"eq": True} and body["rented"] == {"eq": False} and body["allocated_storage"] == 50
    assert body["direct_port_count"] == {"gte": 1} and body["cuda_max_good"] == {"gte": 12.1}


async def test_spot_offers_are_priced_at_the_minimum_bid(vast: VastProvider, fake_vast: FakeVast) -> None:
    offers = await vast.offers(OfferQuery(spot=True, max_price_per_hour=0.3))

    assert [(o.offer_id, o.price_per_hour, o.spot) for o in offers] == [("5001", 0.18, True), ("5002", 0.25, True)]
    body = bodies(fake_vast, "POST", "/bundles/")[0]
    assert body["type"] == "bid" and "dph_total" not in body  # a bid cap is judged on min_bid, here


async def test_offer_filters_reach_vast_and_the_gpu_name_is_matched_here(
    vast: VastProvider, fake_vast: FakeVast
) -> None:
    assert [o.offer_id for o in await vast.offers(OfferQuery(count=2, min_vram_gb=24))] == ["5002"]
    assert [o.offer_id for o in await vast.offers(OfferQuery(min_vram_gb=40, max_price_per_hour=1.5))] == ["5003"]
    assert [o.offer_id for o in await vast.offers(OfferQuery(gpu="rtx4090"))] == ["5001"]
    assert await vast.offers(OfferQuery(max_price_per_hour=0.3)) == []
    first, second, _, fourth = bodies(fake_vast, "POST", "/bundles/")
    assert first["num_gpus"] == {"eq": 2} and first["gpu_ram"] == {"gte": 24000}
    assert second["dph_total"] == {"lte": 1.5} and fourth["dph_total"] == {"lte": 0.3}


# -- renting --------------------------------------------------------------------------------------------------------


async def test_on_demand_create_sends_no_price_and_attaches_the_key(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))

    assert instance.state is InstanceState.STARTING and instance.ssh is None
    assert (instance.name, instance.gpu, instance.price_per_hour, instance.spot) == (
        "rentune-run1",
        "RTX 4090",
        0.4,
        False,
    )
    booked = fake_vast.instances[instance.instance_id]
    assert booked.public_key == key_pair[1] and not booked.spot and booked.extra["price"] is None
    sent = bodies(fake_vast, "PUT", "/asks/5001/")[0]
    assert "price" not in sent
    assert sent["client_id"] == "me" and sent["disk"] == 40 and sent["runtype"] == "ssh_direc ssh_proxy"
    assert booked.env["CONTAINER_API_KEY"] == f"instance-scoped-{instance.instance_id}"


async def test_spot_create_sends_the_bid(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast, spot=True), key_pair[1], bid=0.2))

    assert instance.spot and instance.price_per_hour == 0.2
    assert fake_vast.instances[instance.instance_id].extra["price"] == 0.2
    assert bodies(fake_vast, "PUT", "/asks/")[0]["price"] == 0.2


async def test_a_spot_offer_without_a_bid_is_refused_before_renting(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    offer = await cheapest(vast, spot=True)
    with pytest.raises(ProviderError, match="no bid was given; set a bid"):
        await vast.create(request_for(offer, key_pair[1]))
    assert fake_vast.instances == {}


async def test_out_of_stock_is_no_capacity_with_vasts_words(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    offer = await cheapest(vast)
    fake_vast.faults.out_of_stock = True
    with pytest.raises(NoCapacityError, match="Instance type by id 5001 is not available"):
        await vast.create(request_for(offer, key_pair[1]))
    assert fake_vast.instances == {}


async def test_a_bid_too_low_destroys_the_stopped_contract_vast_booked(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    offer = await cheapest(vast, spot=True)
    with pytest.raises(BidTooLowError, match=r"below the minimum bid \$0.180/hr"):
        await vast.create(request_for(offer, key_pair[1], bid=0.05))

    [booked] = fake_vast.instances.values()
    assert booked.stopped is not None and booked.terminated is not None
    assert fake_vast.live_instances() == []


async def test_a_key_vast_refuses_destroys_the_instance(vast: VastProvider, fake_vast: FakeVast) -> None:
    with pytest.raises(ProviderError, match=r"could not add the run's SSH key.*not an OpenSSH public key"):
        await vast.create(request_for(await cheapest(vast), "not a key"))
    assert len(fake_vast.instances) == 1 and fake_vast.live_instances() == []


# -- states ---------------------------------------------------------------------------------------------------------


async def test_starting_without_ports_then_running_on_the_direct_port(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    fake_vast.boot_seconds = 60
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    fake_vast.instances[instance.instance_id].created -= 45  # past half the boot: the image is loading
    loading = await vast.get(instance.instance_id)
    assert loading.state is InstanceState.STARTING and loading.ssh is None
    assert loading.status_text == "loading: Pulling image layers"

    boot_now(fake_vast, instance.instance_id)
    running = await vast.get(instance.instance_id)

    address = fake_vast.instances[instance.instance_id].address
    assert address is not None and running.state is InstanceState.RUNNING
    assert running.ssh is not None and (running.ssh.host, running.ssh.port) == ("127.0.0.1", address.port)


async def test_the_proxy_is_used_when_there_is_no_direct_port(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    fake_vast.direct_ports = False
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    boot_now(fake_vast, instance.instance_id)

    running = await vast.get(instance.instance_id)

    address = fake_vast.instances[instance.instance_id].address
    assert address is not None and running.ssh is not None and running.ssh.port == address.port


async def test_an_outbid_instance_is_stopped(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast, spot=True), key_pair[1], bid=0.2))
    boot_now(fake_vast, instance.instance_id)
    assert (await vast.get(instance.instance_id)).state is InstanceState.RUNNING

    fake_vast.stop_instance(fake_vast.instances[instance.instance_id], outbid=True)

    outbid = await vast.get(instance.instance_id)
    assert outbid.state is InstanceState.STOPPED and outbid.ssh is None
    assert not fake_vast.pool.alive(instance.instance_id)


async def test_stop_keeps_the_instance_stopped(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    await vast.stop(instance.instance_id)
    assert (await vast.get(instance.instance_id)).state is InstanceState.STOPPED
    assert fake_vast.instances[instance.instance_id].live


@pytest.mark.parametrize(
    ("row", "state"),
    [
        ({"actual_status": None, "intended_status": "running"}, InstanceState.STARTING),
        ({"actual_status": "created", "status_msg": "Error: OCI runtime create failed: x"}, InstanceState.FAILED),
        ({"actual_status": "offline", "intended_status": "running"}, InstanceState.STARTING),
        ({"actual_status": "unknown", "intended_status": "stopped"}, InstanceState.STOPPED),
        ({"actual_status": "frozen", "intended_status": "running"}, InstanceState.STOPPED),
        (
            {"actual_status": "running", "cur_state": "stopped", "intended_status": "stopped", "next_state": "stopped"},
            InstanceState.STOPPED,
        ),
    ],
)
def test_vast_statuses_in_rentunes_words(row: dict[str, Any], state: InstanceState) -> None:
    assert instance_state(row) is state


# -- faults, terminate, list ----------------------------------------------------------------------------------------


async def test_a_429_is_retried(vast: VastProvider, fake_vast: FakeVast) -> None:
    fake_vast.faults.rate_limit_once = True
    assert len(await vast.offers(OfferQuery())) == 3
    assert len(fake_vast.requests) == 2


async def test_a_refused_key_is_an_auth_error(fake_vast: FakeVast) -> None:
    wrong = VastProvider("wrong-key", "http://vast.test/api/v0", transport=fake_vast.transport(), retry=FAST)
    with pytest.raises(AuthError, match="Invalid user key"):
        await wrong.check_key()
    await wrong.aclose()


async def test_check_key_passes_with_a_good_key(vast: VastProvider, fake_vast: FakeVast) -> None:
    await vast.check_key()
    fake_vast.faults.reject_key = True
    with pytest.raises(AuthError):
        await vast.check_key()


async def test_terminate_is_idempotent_and_the_machine_is_gone(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    boot_now(fake_vast, instance.instance_id)
    assert (await vast.get(instance.instance_id)).state is InstanceState.RUNNING

    await vast.terminate(instance.instance_id)
    await vast.terminate(instance.instance_id)

    assert not fake_vast.pool.alive(instance.instance_id)
    assert (await vast.get(instance.instance_id)).state is InstanceState.TERMINATED
    assert (await vast.get("999999")).state is InstanceState.TERMINATED


async def test_instances_lists_the_live_ones(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    first = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    second = await vast.create(request_for(await cheapest(vast, "RTX 3090", spot=True), key_pair[1], bid=0.3))
    await vast.terminate(first.instance_id)

    [listed] = await vast.instances()

    assert (listed.instance_id, listed.spot, listed.gpu, listed.state) == (
        second.instance_id,
        True,
        "RTX 3090",
        InstanceState.STARTING,
    )


async def test_the_registry_opens_this_client(fake_vast: FakeVast, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENTUNE_VAST_URL", "http://vast.test/api/v0")
    provider = open_provider(ProviderName.VAST, api_key="test-key", transport=fake_vast.transport(), retry=FAST)
    assert isinstance(provider, VastProvider)
    await provider.check_key()
    await provider.aclose()


async def test_a_wrong_url_is_an_error_not_a_destroyed_instance(fake_vast: FakeVast) -> None:
    lost = VastProvider("test-key", "http://vast.test/api/v9", transport=fake_vast.transport(), retry=FAST)
    with pytest.raises(ProviderError, match="could not read instance 1001: no route"):
        await lost.get("1001")
    with pytest.raises(ProviderError, match=r"could not destroy instance 1001: no route.*destroy it at"):
        await lost.terminate("1001")
    await lost.aclose()


# -- a real machine over real HTTP ----------------------------------------------------------------------------------


async def test_a_rented_machine_lets_the_runs_key_in(
    fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    fake_vast.boot_seconds = 0.3
    vast = VastProvider("test-key", fake_vast.serve() + "/api/v0", retry=FAST)
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    deadline = time.monotonic() + 15
    while (instance := await vast.get(instance.instance_id)).state is not InstanceState.RUNNING:
        assert time.monotonic() < deadline, instance.status_text
        await asyncio.sleep(0.1)

    machine = fake_vast.instances[instance.instance_id].address
    assert machine is not None and instance.ssh is not None
    known = asyncssh.import_known_hosts(f"[{instance.ssh.host}]:{instance.ssh.port} {machine.host_public_key}")
    async with asyncssh.connect(
        instance.ssh.host, instance.ssh.port, username=machine.user, client_keys=[key_pair[0]], known_hosts=known
    ) as connection:
        result = await connection.run("echo ok", check=True)
    assert str(result.stdout).strip() == "ok"

    await vast.terminate(instance.instance_id)
    assert not fake_vast.pool.alive(instance.instance_id)
    assert (await vast.get(instance.instance_id)).state is InstanceState.TERMINATED
    await vast.aclose()
