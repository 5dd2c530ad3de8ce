"""The Vast.ai client against the fake Vast API: offers, renting (on-demand, bids), states, faults, a real machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest

from desktop.services.billing.ledger import Ledger, RentalState
from desktop.services.providers.base import (
    LOST,
    AuthError,
    BidTooLowError,
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderError,
    ProviderName,
    RateLimitedError,
    RentRequest,
    UncertainOutcomeError,
)
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.market import size_offers
from desktop.services.providers.registry import PROVIDERS, open_provider
from desktop.services.providers.vast import (
    ACTUAL_STATES,
    VastProvider,
    instance_state,
    mib_for_gb,
    nominal_vram_gb,
    v1_url,
)
from desktop.services.renting.creating import CreateTiming, Creator
from desktop.services.renting.terminator import Terminator
from tests.fakes.http import CallFault, FaultKind
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


async def test_spot_offers_are_priced_at_the_minimum_bid_plus_their_disk(
    vast: VastProvider, fake_vast: FakeVast
) -> None:
    offers = await vast.offers(OfferQuery(spot=True, max_price_per_hour=0.3))

    # min_bid 0.18 and 0.25, plus 50 GB at $0.144 per GB per month: $0.01 an hour
    assert [(o.offer_id, o.price_per_hour, o.spot) for o in offers] == [("5001", 0.19, True), ("5002", 0.26, True)]
    body = bodies(fake_vast, "POST", "/bundles/")[0]
    assert body["type"] == "bid" and "dph_total" not in body  # a bid cap is judged on the spot price, here


async def test_spot_and_on_demand_are_priced_on_one_basis_disk_included(
    vast: VastProvider, fake_vast: FakeVast
) -> None:
    """An offer with known fields: both prices are what the machine bills per hour with the disk asked for."""
    offer = next(o for o in fake_vast.offers if o["id"] == 5001)
    offer.update(dph_base=0.30, storage_cost=0.36, min_bid=0.12)  # 200 GB: 0.36 * 200 / 720 = $0.10 an hour
    [on_demand] = await vast.offers(OfferQuery(gpu="RTX 4090", disk_gb=200))
    [spot] = await vast.offers(OfferQuery(gpu="RTX 4090", disk_gb=200, spot=True))
    assert (on_demand.price_per_hour, on_demand.storage_per_hour) == (pytest.approx(0.40), pytest.approx(0.10))
    assert (spot.price_per_hour, spot.storage_per_hour) == (pytest.approx(0.22), pytest.approx(0.10))
    assert bodies(fake_vast, "POST", "/bundles/")[0]["allocated_storage"] == 200, "Vast priced the same disk"


async def test_the_cheapest_spot_offer_is_the_one_that_bills_least_not_the_lowest_bid(
    vast: VastProvider, fake_vast: FakeVast
) -> None:
    """5001 has the lower bid but a dear disk: with 100 GB it bills more than 5002, which ranks first."""
    next(o for o in fake_vast.offers if o["id"] == 5001).update(min_bid=0.10, storage_cost=1.44)  # + $0.20 an hour
    next(o for o in fake_vast.offers if o["id"] == 5002).update(min_bid=0.15, storage_cost=0.072)  # + $0.01 an hour
    offers = await vast.offers(OfferQuery(spot=True, disk_gb=100))
    ranked = size_offers(offers, None, [])
    assert [(s.offer.offer_id, round(s.offer.price_per_hour, 4)) for s in ranked][:2] == [("5002", 0.16), ("5001", 0.3)]


async def test_offer_filters_reach_vast_and_the_gpu_name_is_matched_here(
    vast: VastProvider, fake_vast: FakeVast
) -> None:
    assert [o.offer_id for o in await vast.offers(OfferQuery(count=2, min_vram_gb=24))] == ["5002"]
    assert [o.offer_id for o in await vast.offers(OfferQuery(min_vram_gb=40, max_price_per_hour=1.5))] == ["5003"]
    assert [o.offer_id for o in await vast.offers(OfferQuery(gpu="rtx4090"))] == ["5001"]
    assert await vast.offers(OfferQuery(max_price_per_hour=0.3)) == []
    first, second, _, fourth = bodies(fake_vast, "POST", "/bundles/")
    assert first["num_gpus"] == {"eq": 2} and first["gpu_ram"] == {"gte": mib_for_gb(24)} == {"gte": 22609}
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
        0.398,  # dph_base 0.39 and 40 GB of disk at $0.144 per GB per month
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

    assert instance.spot and instance.price_per_hour == 0.208, "the bid, and 40 GB of disk on top"
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


async def test_a_bid_too_low_names_the_stopped_contract_vast_booked(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    offer = await cheapest(vast, spot=True)
    with pytest.raises(BidTooLowError, match=r"below the minimum bid \$0.180/hr") as caught:
        await vast.create(request_for(offer, key_pair[1], bid=0.05))

    [booked] = fake_vast.instances.values()
    assert caught.value.instance_id == booked.id  # the caller records it and destroys it
    assert booked.stopped is not None and booked.terminated is None
    await vast.terminate(booked.id)
    assert fake_vast.live_instances() == []


async def test_a_key_vast_refuses_hands_the_instance_to_the_caller(vast: VastProvider, fake_vast: FakeVast) -> None:
    fake_vast.faults.failing_terminates = 5  # a destroy now would fail: no "destroyed" claim may be made anyway
    with pytest.raises(ProviderError, match=r"could not add the run's SSH key.*not an OpenSSH public key") as caught:
        await vast.create(request_for(await cheapest(vast), "not a key"))

    [booked] = fake_vast.instances.values()
    assert caught.value.instance_id == booked.id and booked.live
    assert "destroyed" not in str(caught.value)
    assert [r.method for r in fake_vast.requests if "/instances/" in r.path] == ["POST"]  # no destroy tried
    fake_vast.faults.failing_terminates = 0
    await vast.terminate(booked.id)
    assert fake_vast.live_instances() == []


async def test_a_create_answered_502_is_sent_once_and_found_by_its_label(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    offer = await cheapest(vast)
    fake_vast.fail_next("PUT", r"/asks/", CallFault(FaultKind.SERVER_ERROR, after_acting=True, status=502))

    with pytest.raises(UncertainOutcomeError, match="502"):
        await vast.create(request_for(offer, key_pair[1]))

    assert len(bodies(fake_vast, "PUT", "/asks/")) == 1
    [found] = await vast.named("rentune-run1")
    assert found.instance_id in fake_vast.instances
    assert await vast.named("rentune-other") == []


async def test_a_machine_found_by_its_label_after_a_502_gets_the_runs_key_and_boots(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    ledger = Ledger()
    creator = Creator(ledger, Terminator(ledger), CreateTiming(lookup_delay=0.0))
    fake_vast.fail_next("PUT", r"/asks/", CallFault(FaultKind.SERVER_ERROR, after_acting=True, status=502))

    row, instance = await creator.create(vast, "run1", request_for(await cheapest(vast), key_pair[1]), 0.5)

    assert row.state is RentalState.LIVE and row.instance_id == instance.instance_id
    assert fake_vast.instances[instance.instance_id].public_key == key_pair[1], "the key the create never attached"
    assert len(bodies(fake_vast, "PUT", "/asks/")) == 1 and len(bodies(fake_vast, "POST", "/ssh/")) == 1
    boot_now(fake_vast, instance.instance_id)
    assert (await vast.get(instance.instance_id)).state is InstanceState.RUNNING


async def test_a_create_without_an_answer_is_not_sent_again(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    offer = await cheapest(vast)
    fake_vast.fail_next("PUT", r"/asks/", CallFault(FaultKind.TIMEOUT), times=3)

    with pytest.raises(UncertainOutcomeError):
        await vast.create(request_for(offer, key_pair[1]))

    assert len([r for r in fake_vast.requests if r.method == "PUT" and "/asks/" in r.path]) == 1
    assert await vast.named("rentune-run1") == []


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
        ({"actual_status": "scheduling", "intended_status": "running"}, InstanceState.STARTING),
        ({"actual_status": "created", "intended_status": "running"}, InstanceState.STARTING),
        ({"actual_status": "loading", "intended_status": "running"}, InstanceState.STARTING),
        ({"actual_status": "rebooting", "intended_status": "running"}, InstanceState.STARTING),
        ({"actual_status": "running", "intended_status": "running"}, InstanceState.RUNNING),
        ({"actual_status": "stopped", "intended_status": "running"}, InstanceState.STOPPED),
        ({"actual_status": "frozen", "intended_status": "running"}, InstanceState.STOPPED),
        ({"actual_status": "exited", "intended_status": "running"}, InstanceState.FAILED),
        ({"actual_status": "unknown", "intended_status": "running"}, InstanceState.FAILED),
        ({"actual_status": "offline", "intended_status": "running"}, InstanceState.FAILED),
        ({"actual_status": "created", "status_msg": "Error: OCI runtime create failed: x"}, InstanceState.FAILED),
        ({"actual_status": "exited", "intended_status": "stopped"}, InstanceState.STOPPED),  # stopped by the user
        ({"actual_status": "unknown", "intended_status": "stopped"}, InstanceState.STOPPED),
        ({"actual_status": "something-new", "intended_status": "running"}, InstanceState.STARTING),
        ({"actual_status": "something-new", "intended_status": "stopped"}, InstanceState.STOPPED),
        (
            {"actual_status": "running", "cur_state": "stopped", "intended_status": "stopped", "next_state": "stopped"},
            InstanceState.STOPPED,
        ),
    ],
)
def test_vast_statuses_in_rentunes_words(row: dict[str, Any], state: InstanceState) -> None:
    assert instance_state(row) is state


def test_every_documented_status_is_mapped_and_the_dead_ends_end_the_wait() -> None:
    documented = {None, "created", "loading", "running", "stopped", "frozen", "exited", "rebooting", "unknown"}
    assert documented | {"offline"} <= set(ACTUAL_STATES)
    for status in ("exited", "unknown", "offline"):
        assert ACTUAL_STATES[status] is InstanceState.FAILED and ACTUAL_STATES[status] in LOST


@pytest.mark.parametrize("status", ["exited", "unknown", "offline"])
async def test_a_lost_host_is_failed_at_once(
    status: str, vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    fake_vast.lose_host(instance.instance_id, status)

    lost = await vast.get(instance.instance_id)

    assert lost.state is InstanceState.FAILED and lost.ssh is None
    assert lost.status_text == f"{status}: host {status}"


# -- VRAM in MiB ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mib", "gb"),
    [(24564, 24.0), (24576, 24.0), (81559, 80.0), (81920, 80.0), (46068, 48.0), (49140, 48.0), (143771, 141.0)],
)
def test_gpu_ram_in_mib_reads_as_the_cards_size(mib: int, gb: float) -> None:
    assert nominal_vram_gb(mib) == gb
    assert mib >= mib_for_gb(gb)  # and passes a filter for that size at Vast


def test_memory_of_no_known_size_is_given_in_gib() -> None:
    assert nominal_vram_gb(3 * 1024 + 100) == 3.1


async def test_an_h100_of_81559_mib_passes_an_80_gb_filter(vast: VastProvider, fake_vast: FakeVast) -> None:
    h100 = next(o for o in fake_vast.offers if o["gpu_name"] == "H100 SXM")
    h100["cuda_max_good"] = 12.8
    fake_vast.offers.append({**h100, "id": 5006, "gpu_name": "L40S", "gpu_ram": 46068, "dph_base": 0.89})

    assert [(o.offer_id, o.vram_gb) for o in await vast.offers(OfferQuery(min_vram_gb=80))] == [
        ("5003", 80.0),
        ("5005", 80.0),
    ]
    assert [o.offer_id for o in await vast.offers(OfferQuery(gpu="L40S", min_vram_gb=48))] == ["5006"]
    assert bodies(fake_vast, "POST", "/bundles/")[0]["gpu_ram"]["gte"] <= 81559


# -- faults, terminate, list ----------------------------------------------------------------------------------------


async def test_a_429_is_retried(vast: VastProvider, fake_vast: FakeVast) -> None:
    fake_vast.faults.rate_limit_once = True
    assert len(await vast.offers(OfferQuery())) == 3
    assert len(fake_vast.requests) == 2


async def test_a_429_keeps_vasts_detail(vast: VastProvider, fake_vast: FakeVast) -> None:
    fake_vast.fail_next("POST", r"/bundles/", CallFault(FaultKind.RATE_LIMIT), times=FAST.attempts)
    with pytest.raises(RateLimitedError, match="API requests too frequent"):
        await vast.offers(OfferQuery())
    assert len(fake_vast.requests) == FAST.attempts


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


async def test_a_delete_of_a_missing_instance_is_vasts_404_not_found_and_reads_as_gone(
    vast: VastProvider, fake_vast: FakeVast
) -> None:
    async with httpx.AsyncClient(transport=fake_vast.transport(), base_url="http://vast.test/api/v0") as raw:
        answer = await raw.delete("/instances/999999/", headers={"Authorization": "Bearer test-key"})
    assert (answer.status_code, answer.json()["error"]) == (404, "not_found"), "what Vast answers"
    await vast.terminate("999999")  # never existed: gone, not an error


async def test_an_instance_destroyed_meanwhile_is_confirmed_gone_by_one_terminate(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str], tmp_path: Path
) -> None:
    """The user destroys the machine in Vast's console between Rentune's look and its DELETE: the DELETE's 404
    not_found ends it, in one attempt, with no error left (the terminator's "terminated until gone")."""
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.open("run-1", "vast", instance.instance_id, "RTX 4090", 0.4, label="rentune-run1")
    real_get = vast.get
    looks: list[InstanceState] = []

    async def look_then_destroyed_in_the_console(instance_id: str) -> Instance:
        found = await real_get(instance_id)
        looks.append(found.state)
        if len(looks) == 1:
            fake_vast.terminate_instance(fake_vast.instances[instance_id])
        return found

    vast.get = look_then_destroyed_in_the_console  # type: ignore[method-assign]
    terminator = Terminator(ledger)
    assert await terminator.attempt(vast, instance.instance_id)
    assert terminator.why_not("vast", instance.instance_id) == ""
    # Rentune's look, the look confirming the DELETE's not_found, the terminator's look after its DELETE.
    assert looks == [InstanceState.STARTING, InstanceState.TERMINATED, InstanceState.TERMINATED]
    [row] = ledger.rentals("run-1")
    assert row.state is RentalState.ENDED


async def test_instances_follow_every_page_of_the_v1_list(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    fake_vast.page_size = 2
    created = [await vast.create(request_for(await cheapest(vast), key_pair[1])) for _ in range(5)]

    listed = await vast.instances()

    assert sorted(i.instance_id for i in listed) == sorted(i.instance_id for i in created)
    pages = [r for r in fake_vast.requests if r.method == "GET" and r.path.startswith("/api/v1/instances")]
    assert len(pages) == 3 and "after_token" not in pages[0].query
    assert [p.query["after_token"] for p in pages[1:]] == [
        [f"after-{created[1].instance_id}"],
        [f"after-{created[3].instance_id}"],
    ]
    assert not any(r.method == "GET" and r.path == "/api/v0/instances/" for r in fake_vast.requests)
    assert len(await vast.named("rentune-run1")) == 5


async def test_an_instance_has_vasts_start_date(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    booked = fake_vast.instances[instance.instance_id]
    assert instance.created_at == booked.created and instance.ended_at is None


def test_the_v1_list_is_on_the_v0_host() -> None:
    assert v1_url("https://console.vast.ai/api/v0") == "https://console.vast.ai/api/v1"
    assert v1_url("http://127.0.0.1:8080/api/v0/") == "http://127.0.0.1:8080/api/v1"
    assert v1_url("http://vast.test") == "http://vast.test/api/v1"
    assert PROVIDERS[ProviderName.VAST].default_url == "https://console.vast.ai/api/v0"


async def test_the_fake_bills_from_create_to_destroy(
    vast: VastProvider, fake_vast: FakeVast, key_pair: tuple[asyncssh.SSHKey, str]
) -> None:
    instance = await vast.create(request_for(await cheapest(vast), key_pair[1]))
    booked = fake_vast.instances[instance.instance_id]
    booked.extra["booked_at"] -= 30
    await vast.terminate(instance.instance_id)
    billed = fake_vast.billed_seconds(instance.instance_id)
    assert 30 <= billed < 40
    await asyncio.sleep(0.05)
    assert fake_vast.billed_seconds(instance.instance_id) == billed


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
