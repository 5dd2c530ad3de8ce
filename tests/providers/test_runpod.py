"""RunPodProvider against the fake RunPod: REST v2 for pods and the catalog, GraphQL for spot only (in-process
transport; one test over real HTTP and sshd)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncssh
import pytest

from desktop.services.providers.base import (
    LOST,
    AuthError,
    BidTooLowError,
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    Provider,
    ProviderError,
    ProviderName,
    RentRequest,
    SpotUnavailableError,
    UncertainOutcomeError,
)
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.registry import PROVIDERS, open_provider
from desktop.services.providers.runpod import RunPodProvider, epoch_of, gpu_words, pod_state, ssh_address
from desktop.services.providers.runpod_graphql import RunPodGraphQL, error_for
from tests.fakes.http import CallFault, FakeRequest, FakeResponse, FaultKind
from tests.fakes.runpod import OUT_OF_STOCK, FakeRunPod, problem

RETRY = RetryPolicy(first_delay=0.01)
IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
PODS = r"/v2/pods$"


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


def rent(offer: Offer, public_key: str, bid: float | None = None, label: str = "rentune-run1") -> RentRequest:
    return RentRequest(offer, public_key, label, IMAGE, disk_gb=40, bid_per_hour=bid)


def calls(fake: FakeRunPod, method: str, path: str) -> list[FakeRequest]:
    return [r for r in fake.requests if r.method == method and r.path.rstrip("/") == path]


async def wait_for(provider: Provider, pod_id: str, state: InstanceState) -> Instance:
    deadline = time.monotonic() + 15
    while True:
        instance = await provider.get(pod_id)
        if instance.state == state or time.monotonic() > deadline:
            return instance
        await asyncio.sleep(0.05)


# -- on-demand offers: the v2 catalog --------------------------------------------------------------------------------


async def test_on_demand_offers_come_from_the_catalog_of_both_clouds(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    offers = await provider.offers(OfferQuery(gpu="rtx 4090"))
    by_place = {o.location: o for o in offers}
    assert set(by_place) == {"secure cloud (US-KS-2)", "community cloud (CA-MTL-1)"}
    secure = by_place["secure cloud (US-KS-2)"]
    assert (secure.price_per_hour, secure.vram_gb, secure.count, secure.spot) == (0.69, 24.0, 1, False)
    assert secure.offer_id == "NVIDIA GeForce RTX 4090|SECURE|1"
    assert (secure.gpu, secure.gpu_id, secure.in_stock, secure.reliability) == (
        "RTX 4090",
        "NVIDIA GeForce RTX 4090",
        True,
        None,
    )
    assert by_place["community cloud (CA-MTL-1)"].price_per_hour == 0.44
    asked = calls(fake, "GET", "/v2/catalog/gpus")
    assert sorted(r.query["cloud"][0] for r in asked) == ["COMMUNITY", "SECURE"]
    assert all(
        (r.query["include"], r.query["product"], r.query["count"]) == (["AVAILABILITY"], ["POD"], ["1"]) for r in asked
    )
    assert calls(fake, "POST", "/graphql") == [], "on-demand offers never touch GraphQL"


async def test_a_count_is_priced_and_stocked_for_that_count(provider: RunPodProvider, fake: FakeRunPod) -> None:
    offers = await provider.offers(OfferQuery(gpu="A100 PCIe", count=2))
    assert sorted((o.offer_id, o.price_per_hour) for o in offers) == [
        ("NVIDIA A100 80GB PCIe|COMMUNITY|2", 2.38),
        ("NVIDIA A100 80GB PCIe|SECURE|2", 3.28),
    ]
    assert {r.query["count"][0] for r in calls(fake, "GET", "/v2/catalog/gpus")} == {"2"}


async def test_out_of_stock_is_flagged_and_unsold_clouds_are_skipped(provider: RunPodProvider) -> None:
    offers = await provider.offers(OfferQuery(gpu="H100 SXM"))
    assert [(o.location, o.price_per_hour, o.in_stock) for o in offers] == [("secure cloud", 2.99, False)]


async def test_filters_apply_to_vram_price_and_count(provider: RunPodProvider) -> None:
    big = await provider.offers(OfferQuery(min_vram_gb=80, max_price_per_hour=2.0))
    assert sorted((o.gpu, o.price_per_hour) for o in big) == [("A100 PCIe", 1.19), ("A100 PCIe", 1.64)]
    assert await provider.offers(OfferQuery(count=16)) == []  # more than any type's maxCount


# -- spot offers: GraphQL, while it answers --------------------------------------------------------------------------


async def test_spot_offers_price_the_minimum_bid_times_count(provider: RunPodProvider, fake: FakeRunPod) -> None:
    offers = await provider.offers(OfferQuery(gpu="NVIDIA GeForce RTX 4090", count=2, spot=True))
    assert sorted((o.offer_id, o.price_per_hour, o.spot, o.location) for o in offers) == [
        ("NVIDIA GeForce RTX 4090|COMMUNITY|2", 0.58, True, "community cloud (CA)"),
        ("NVIDIA GeForce RTX 4090|SECURE|2", 0.68, True, "secure cloud (US)"),
    ]
    assert calls(fake, "GET", "/v2/catalog/gpus") == [], "spot offers do not come from the v2 catalog"
    assert len(calls(fake, "POST", "/graphql")) == 2


async def test_graphql_is_posted_to_graphql_without_a_trailing_slash(fake: FakeRunPod) -> None:
    """runpodctl and runpod-python post to ``https://api.runpod.io/graphql``; the fake serves nothing else there."""
    client = RunPodProvider(fake.valid_key, transport=fake.transport(), retry=RETRY)
    assert await client.offers(OfferQuery(gpu="RTX 4090", spot=True)), "spot offers are listed"
    await client.aclose()
    posted = {str(r.path) for r in fake.requests if r.method == "POST"}
    assert posted == {"/graphql"}
    assert PROVIDERS[ProviderName.RUNPOD].default_graphql_url == "https://api.runpod.io/graphql"


async def test_the_fake_serves_graphql_at_graphql_only(fake: FakeRunPod) -> None:
    """A client that adds a slash (as an httpx base URL with an empty path does) is answered 404, as RunPod may."""
    slashed = RunPodGraphQL(fake.valid_key, "https://api.runpod.io/graphql", transport=fake.transport(), retry=RETRY)
    slashed.url = "https://api.runpod.io/graphql/"
    with pytest.raises(ProviderError, match="GraphQL answered 404"):
        await slashed.spot_gpus("SECURE", 1)
    await slashed.aclose()


@pytest.mark.parametrize("status", [404, 410, 500, 401])
async def test_spot_offers_missing_because_graphql_does_not_answer_say_so(
    provider: RunPodProvider, fake: FakeRunPod, status: int
) -> None:
    fake.graphql_status = status
    with pytest.raises(SpotUnavailableError, match=r"RunPod's spot offers could not be listed \(.+\); .*spot = false"):
        await provider.offers(OfferQuery(spot=True))
    assert calls(fake, "POST", "/graphql"), "GraphQL was asked"
    assert [o for o in await provider.offers(OfferQuery()) if o.in_stock], "on-demand offers are unaffected"


async def test_spot_offers_missing_because_graphql_drops_the_connection_say_so(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    fake.fail_next("POST", r"/graphql/?$", CallFault(FaultKind.DROP), times=20)
    with pytest.raises(SpotUnavailableError, match="dropped"):
        await provider.offers(OfferQuery(spot=True))


# -- create ----------------------------------------------------------------------------------------------------------


async def test_create_posts_the_v2_body_once_and_hands_over_the_key(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure")
    before = time.time()
    instance = await provider.create(rent(offer, public_key, bid=5.0))  # a bid on an on-demand offer is ignored
    assert (instance.state, instance.status_text, instance.ssh, instance.spot) == (
        InstanceState.STARTING,
        "PROVISIONING",
        None,
        False,
    )
    assert (instance.name, instance.gpu, instance.price_per_hour) == ("rentune-run1", "RTX 4090", 0.69)
    assert instance.created_at is not None and before - 1 <= instance.created_at <= time.time() + 1
    assert len(calls(fake, "POST", "/v2/pods")) == 1 and calls(fake, "POST", "/graphql") == []
    booked = fake.instances[instance.instance_id]
    assert booked.extra["body"] == {
        "name": "rentune-run1",
        "image": IMAGE,
        "cloud": "SECURE",
        "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1},
        "disk": 40,
        "ports": ["22/tcp"],
        "env": {"PUBLIC_KEY": public_key},
        "startSsh": True,
    }
    assert booked.public_key == public_key and "PUBLIC_KEY" not in booked.env
    assert booked.env["RUNPOD_POD_ID"] == instance.instance_id


@pytest.mark.parametrize("after_acting", [False, True])
async def test_a_502_on_create_is_uncertain_and_never_repeated(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str, after_acting: bool
) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure")
    fake.fail_next("POST", PODS, CallFault(FaultKind.SERVER_ERROR, after_acting=after_acting, status=502))
    with pytest.raises(UncertainOutcomeError, match="502"):
        await provider.create(rent(offer, public_key))
    assert len(calls(fake, "POST", "/v2/pods")) == 1
    found = await provider.named("rentune-run1")
    assert [i.instance_id for i in found] == list(fake.instances) and len(found) == int(after_acting)


async def test_a_timeout_after_acting_is_uncertain_and_named_finds_the_pod(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "community")
    await provider.create(rent(offer, public_key, label="rentune-other"))
    fake.fail_next("POST", PODS, CallFault(FaultKind.TIMEOUT, after_acting=True))
    with pytest.raises(UncertainOutcomeError):
        await provider.create(rent(offer, public_key))
    assert len(calls(fake, "POST", "/v2/pods")) == 2  # one each: the lost one was not sent again
    [found] = await provider.named("rentune-run1")
    [booked] = [i for i in fake.instances.values() if i.label == "rentune-run1"]
    assert (found.instance_id, found.name, found.state) == (booked.id, "rentune-run1", InstanceState.STARTING)
    await provider.terminate(found.instance_id)
    assert await provider.named("rentune-run1") == []


async def test_a_429_on_create_is_retried(provider: RunPodProvider, fake: FakeRunPod, public_key: str) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure")
    fake.fail_next("POST", PODS, CallFault(FaultKind.RATE_LIMIT))
    await provider.create(rent(offer, public_key))
    assert len(calls(fake, "POST", "/v2/pods")) == 2 and len(fake.instances) == 1


async def test_out_of_stock_create_keeps_runpods_words(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure")
    fake.faults.out_of_stock = True
    with pytest.raises(NoCapacityError) as caught:
        await provider.create(rent(offer, public_key))
    assert OUT_OF_STOCK in str(caught.value) and str(caught.value).startswith("RunPod: ")
    fake.faults.out_of_stock = False
    with pytest.raises(NoCapacityError):  # H100 has no stock
        await provider.create(rent(await find_offer(provider, "H100 SXM", "secure"), public_key))
    assert fake.instances == {}


async def test_an_empty_balance_and_a_refused_body_keep_runpods_words(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure")
    monkeypatch.setattr(fake, "_create", lambda request: problem(402, "insufficient balance"))
    with pytest.raises(ProviderError, match=r"insufficient balance.*add funds") as caught:
        await provider.create(rent(offer, public_key))
    assert type(caught.value) is ProviderError
    monkeypatch.setattr(fake, "_create", lambda request: problem(422, "bad body", ["$: 'bogus' not allowed"]))
    with pytest.raises(ProviderError, match=r"refused \(422\): bad body \(\$: 'bogus' not allowed\)"):
        await provider.create(rent(offer, public_key))


# -- status, SSH, times ----------------------------------------------------------------------------------------------


async def test_pod_starts_without_ssh_then_runs_with_the_direct_address(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    created = await provider.create(rent(await find_offer(provider, "A100 PCIe", "secure"), public_key))
    starting = await provider.get(created.instance_id)
    assert (starting.state, starting.ssh) == (InstanceState.STARTING, None)
    assert starting.status_text in ("PROVISIONING", "STARTING")
    running = await wait_for(provider, created.instance_id, InstanceState.RUNNING)
    address = fake.instances[created.instance_id].address
    assert running.state == InstanceState.RUNNING and address is not None
    assert running.ssh is not None and (running.ssh.host, running.ssh.port, running.ssh.user) == (
        "127.0.0.1",
        address.port,
        "root",
    )
    assert (running.name, running.gpu, running.price_per_hour) == ("rentune-run1", "A100 80GB PCIe", 1.64)
    assert running.created_at == pytest.approx(fake.instances[created.instance_id].created, abs=0.01)
    assert running.ended_at is None


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("PROVISIONING", InstanceState.STARTING),
        ("STARTING", InstanceState.STARTING),
        ("RUNNING", InstanceState.RUNNING),
        ("EXITED", InstanceState.STOPPED),
        ("ERROR", InstanceState.FAILED),
        ("TERMINATED", InstanceState.TERMINATED),
        ("SOMETHING_NEW", InstanceState.STARTING),
    ],
)
async def test_every_v2_status_is_mapped(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str, status: str, state: InstanceState
) -> None:
    created = await provider.create(rent(await find_offer(provider, "RTX 4090", "secure"), public_key))
    fake.statuses[created.instance_id] = status
    seen = await provider.get(created.instance_id)
    assert (seen.state, seen.status_text) == (state, status)


@pytest.mark.parametrize("status", ["EXITED", "ERROR", "TERMINATED", "DEAD", "PAUSED"])
def test_terminal_statuses_end_a_wait_at_once(status: str) -> None:
    assert pod_state(status) in LOST


@pytest.mark.parametrize(
    ("status", "state"),
    [("CREATED", InstanceState.STARTING), ("RESTARTING", InstanceState.STARTING), ("DEAD", InstanceState.FAILED)],
)
def test_graphql_statuses_are_mapped(status: str, state: InstanceState) -> None:
    assert pod_state(status) == state


def test_ssh_falls_back_to_the_published_22_tcp_port() -> None:
    pod = {
        "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": "x-1"}, "direct": None},
        "runtime": {
            "ports": [
                {"private": 8888, "public": 100, "type": "http", "ip": "100.64.0.1"},
                {"private": 22, "public": 34446, "type": "tcp", "ip": "195.26.233.3"},
            ]
        },
    }
    address = ssh_address(pod)
    assert address is not None and (address.host, address.port, address.user) == ("195.26.233.3", 34446, "root")
    assert ssh_address({"ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22}, "direct": None}}) is None


@pytest.mark.parametrize(
    ("gpu_id", "words"),
    [
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("AMD Instinct MI300X OAM", "Instinct MI300X OAM"),
        ("", ""),
    ],
)
def test_a_pods_gpu_reads_without_brand_words(gpu_id: str, words: str) -> None:
    assert gpu_words(gpu_id) == words


def test_rfc3339_times_read_as_epoch_seconds() -> None:
    assert epoch_of("2026-03-13T20:00:00Z") == 1773432000.0
    assert epoch_of("2026-03-13T20:00:00.5+01:00") == 1773428400.5
    assert epoch_of("2026-03-13T20:00:00") == 1773432000.0  # no zone: UTC
    assert epoch_of(None) is None and epoch_of("yesterday") is None


async def test_unknown_pod_is_terminated(provider: RunPodProvider) -> None:
    assert (await provider.get("nope")).state == InstanceState.TERMINATED


# -- stop, terminate, list -------------------------------------------------------------------------------------------


async def test_terminate_deletes_and_a_404_means_gone(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    created = await provider.create(rent(await find_offer(provider, "RTX 4090", "secure"), public_key))
    await wait_for(provider, created.instance_id, InstanceState.RUNNING)
    assert fake.pool.alive(created.instance_id)
    await provider.terminate(created.instance_id)
    assert not fake.pool.alive(created.instance_id)
    assert (await provider.get(created.instance_id)).state == InstanceState.TERMINATED
    await provider.terminate(created.instance_id)  # 404 "pod not found": already gone
    deletes = calls(fake, "DELETE", f"/v2/pods/{created.instance_id}")
    assert len(deletes) == 2
    assert await provider.instances() == []


async def test_a_404_that_is_not_runpods_is_an_error_not_gone(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = await provider.create(rent(await find_offer(provider, "RTX 4090", "secure"), public_key))
    monkeypatch.setattr(fake, "_delete", lambda request, pod_id: FakeResponse(404, b"<html>Not Found</html>"))
    with pytest.raises(ProviderError, match="404"):
        await provider.terminate(created.instance_id)
    monkeypatch.setattr(fake, "_get", lambda request, pod_id: FakeResponse(404, b"<html>Not Found</html>"))
    with pytest.raises(ProviderError, match="404"):
        await provider.get(created.instance_id)


async def test_a_failing_delete_is_retried(provider: RunPodProvider, fake: FakeRunPod, public_key: str) -> None:
    created = await provider.create(rent(await find_offer(provider, "RTX 4090", "secure"), public_key))
    fake.faults.failing_terminates = 2
    await provider.terminate(created.instance_id)
    assert fake.instances[created.instance_id].terminated is not None


async def test_instances_lists_running_and_stopped_pods(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "community")
    first = await provider.create(rent(offer, public_key))
    second = await provider.create(rent(offer, public_key, label="rentune-run2"))
    await provider.stop(second.instance_id)
    assert len(calls(fake, "POST", f"/v2/pods/{second.instance_id}/action")) == 1
    listed = {i.instance_id: i for i in await provider.instances()}
    assert set(listed) == {first.instance_id, second.instance_id}
    assert (listed[second.instance_id].state, listed[second.instance_id].price_per_hour) == (InstanceState.STOPPED, 0)
    assert listed[second.instance_id].name == "rentune-run2"
    assert listed[first.instance_id].state in (InstanceState.STARTING, InstanceState.RUNNING)
    assert [i.instance_id for i in await provider.named("rentune-run2")] == [second.instance_id]


async def test_instances_follow_every_page(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    offer = await find_offer(provider, "RTX 4090", "community")
    ids = [(await provider.create(rent(offer, public_key, label=f"rentune-{n}"))).instance_id for n in range(3)]
    pods = [fake.pod_of(fake.instances[i]) for i in ids]

    def paged(request: FakeRequest) -> FakeResponse:
        start = int((request.query.get("cursor") or ["0"])[0])
        more = start + 2 < len(pods)
        page = {"hasNextPage": more, "nextCursor": str(start + 2) if more else None}
        return FakeResponse(200, {"pods": pods[start : start + 2], "pagination": page})

    monkeypatch.setattr(fake, "_list", paged)
    assert [i.instance_id for i in await provider.instances()] == ids
    assert [i.name for i in await provider.named("rentune-2")] == ["rentune-2"]


# -- spot rentals: GraphQL -------------------------------------------------------------------------------------------


async def test_create_spot_rents_interruptable_through_graphql_at_bid_per_gpu(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "community", spot=True, count=2)
    instance = await provider.create(rent(offer, public_key, bid=0.8))
    assert calls(fake, "POST", "/v2/pods") == [] and len(calls(fake, "POST", "/graphql")) == 3  # 2 offers, 1 rent
    spec = fake.instances[instance.instance_id].extra["input"]
    assert (spec["bidPerGpu"], spec["cloudType"], spec["gpuCount"], spec["name"]) == (
        0.4,
        "COMMUNITY",
        2,
        "rentune-run1",
    )
    assert (spec["ports"], spec["containerDiskInGb"], spec["volumeInGb"]) == ("22/tcp", 40, 0)
    assert spec["env"] == [{"key": "PUBLIC_KEY", "value": public_key}]
    assert (instance.spot, instance.price_per_hour, instance.gpu) == (True, 0.8, "RTX 4090")
    seen = await provider.get(instance.instance_id)  # watched through v2 like any pod
    assert seen.state in (InstanceState.STARTING, InstanceState.RUNNING)


async def test_a_502_on_a_spot_rental_is_uncertain_and_never_repeated(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure", spot=True)
    fake.fail_next("POST", r"/graphql/?$", CallFault(FaultKind.SERVER_ERROR, after_acting=True, status=502))
    asked = len(calls(fake, "POST", "/graphql"))
    with pytest.raises(UncertainOutcomeError):
        await provider.create(rent(offer, public_key))
    assert len(calls(fake, "POST", "/graphql")) == asked + 1
    assert len(await provider.named("rentune-run1")) == 1


async def test_a_low_bid_is_refused(provider: RunPodProvider, fake: FakeRunPod, public_key: str) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure", spot=True)
    with pytest.raises(BidTooLowError, match="too low"):
        await provider.create(rent(offer, public_key, bid=0.10))
    fake.faults.bid_too_low = True
    with pytest.raises(BidTooLowError):
        await provider.create(rent(offer, public_key, bid=offer.price_per_hour))
    assert fake.instances == {}


async def test_a_spot_rental_once_graphql_is_gone_is_a_plain_refusal(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    offer = await find_offer(provider, "RTX 4090", "secure", spot=True)
    fake.graphql_status = 410
    with pytest.raises(ProviderError, match="410") as caught:
        await provider.create(rent(offer, public_key))
    assert type(caught.value) is ProviderError and fake.instances == {}


async def test_an_outbid_spot_pod_is_stopped(provider: RunPodProvider, fake: FakeRunPod, public_key: str) -> None:
    fake.faults.outbid_after = 0.0
    offer = await find_offer(provider, "RTX 4090", "secure", spot=True)
    created = await provider.create(rent(offer, public_key, bid=offer.price_per_hour))
    stopped = await wait_for(provider, created.instance_id, InstanceState.STOPPED)
    assert (stopped.state, stopped.ssh, stopped.status_text) == (InstanceState.STOPPED, None, "EXITED")
    assert fake.instances[created.instance_id].extra["outbid"] is True
    assert not fake.pool.alive(created.instance_id)


async def test_a_misspelt_graphql_field_is_refused_by_the_schema(fake: FakeRunPod) -> None:
    client = RunPodGraphQL(fake.valid_key, transport=fake.transport(), retry=RETRY)
    try:
        with pytest.raises(ProviderError, match="Cannot query field 'idd'") as caught:
            await client.run("query { gpuTypes { idd } }")
        assert type(caught.value) is ProviderError
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("errors", "kind"),
    [
        ([{"message": "Unauthorized"}], AuthError),
        ([{"message": "denied", "extensions": {"code": "UNAUTHENTICATED"}}], AuthError),
        ([{"message": "There are not enough free GPUs on the host machine to start this pod."}], NoCapacityError),
        ([{"message": "There are no instances available with the request specifications."}], NoCapacityError),
        ([{"message": "bid is below the minimum"}], BidTooLowError),
        ([{"message": "Something else broke"}], ProviderError),
        ([{"message": "Request failed with status code 401"}], AuthError),
        ([{"message": "pod x401 not found to terminate"}], ProviderError),
    ],
)
def test_graphql_error_messages_map_to_rentune_errors(
    errors: list[dict[str, object]], kind: type[ProviderError]
) -> None:
    error = error_for(errors)
    assert type(error) is kind and str(errors[0]["message"]) in str(error)


# -- keys and the fake's book ----------------------------------------------------------------------------------------


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


async def test_the_fake_bills_from_create_to_delete(
    provider: RunPodProvider, fake: FakeRunPod, public_key: str
) -> None:
    created = await provider.create(rent(await find_offer(provider, "RTX 4090", "secure"), public_key))
    await asyncio.sleep(0.1)
    await provider.stop(created.instance_id)  # a stopped pod still bills its disk
    assert fake.billed_seconds(created.instance_id) >= 0.1
    await provider.terminate(created.instance_id)
    billed = fake.billed_seconds(created.instance_id)
    await asyncio.sleep(0.05)
    assert fake.billed_seconds(created.instance_id) == billed


def test_the_graphql_url_sits_beside_an_overridden_rest_url(monkeypatch: pytest.MonkeyPatch) -> None:
    info = PROVIDERS[ProviderName.RUNPOD]
    monkeypatch.delenv("RENTUNE_RUNPOD_URL", raising=False)
    monkeypatch.delenv("RENTUNE_RUNPOD_GRAPHQL_URL", raising=False)
    assert (info.url, info.graphql_url) == ("https://api.runpod.io/v2", "https://api.runpod.io/graphql")
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", "http://127.0.0.1:9/v2/")
    assert info.graphql_url == "http://127.0.0.1:9/graphql"
    monkeypatch.setenv("RENTUNE_RUNPOD_GRAPHQL_URL", "http://spot.example/graphql")
    assert info.graphql_url == "http://spot.example/graphql"
    assert PROVIDERS[ProviderName.VAST].graphql_url is None


# -- real HTTP and a real machine ------------------------------------------------------------------------------------


async def test_a_pod_rented_over_http_lets_the_key_in_and_goes_away(
    fake: FakeRunPod, client_key: asyncssh.SSHKey, public_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", fake.serve() + "/v2")
    client = open_provider(ProviderName.RUNPOD, api_key=fake.valid_key, retry=RETRY)
    try:
        assert await client.offers(OfferQuery(spot=True)), "spot offers come from the served GraphQL"
        offer = next(o for o in await client.offers(OfferQuery(gpu="RTX 4090")) if o.location.startswith("secure"))
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
