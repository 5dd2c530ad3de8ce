"""LambdaProvider against FakeLambda: offers, keys, launch, states, errors, rate limits, and one real machine."""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest

from desktop.services.providers.base import (
    LOST,
    AuthError,
    Instance,
    InstanceState,
    NoCapacityError,
    Offer,
    OfferQuery,
    ProviderError,
    ProviderName,
    RentRequest,
    SshAddress,
    UncertainOutcomeError,
)
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.lambda_cloud import (
    LAMBDA_RETRY,
    LAUNCH_INTERVAL_S,
    REQUEST_INTERVAL_S,
    STATES,
    LambdaProvider,
    Pacer,
    instance_from,
    parse_description,
    vm_ssh,
)
from desktop.services.providers.registry import PROVIDERS
from tests.fakes.http import CallFault, FakeRequest, FakeResponse, FaultKind
from tests.fakes.lambda_cloud import FakeLambda, ManualClock

QUICK = RetryPolicy(first_delay=0.01)


@pytest.fixture
def clock() -> ManualClock:
    """The time of Lambda's rate limits, for the fake and the client's pacer alike: nobody really sleeps."""
    return ManualClock()


def paced(clock: ManualClock) -> Pacer:
    """A pacer at Lambda's limits on the test's clock."""
    return Pacer(clock=clock.now, sleep=clock.sleep)


@pytest.fixture
def cloud(tmp_path: Path, clock: ManualClock) -> Iterator[FakeLambda]:
    fake = FakeLambda(tmp_path / "lambda", boot_seconds=600, clock=clock.now)  # booting until a test moves time on
    yield fake
    fake.close()


@pytest.fixture
async def lam(cloud: FakeLambda, clock: ManualClock) -> AsyncIterator[LambdaProvider]:
    provider = LambdaProvider("test-key", transport=cloud.transport(), retry=QUICK, pacer=paced(clock))
    yield provider
    await provider.aclose()


def public_key() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


def offer(offer_id: str = "gpu_1x_a10@us-east-1") -> Offer:
    type_name, _, region = offer_id.partition("@")
    return Offer(ProviderName.LAMBDA, offer_id, "A10", type_name, 1, 24.0, 0.75, False, None, region)


def rent(key: str, label: str = "rentune-r1", offer_id: str = "gpu_1x_a10@us-east-1") -> RentRequest:
    return RentRequest(offer(offer_id), key, label, image="")


def calls(cloud: FakeLambda, method: str, path: str) -> list[FakeRequest]:
    return [r for r in cloud.requests if r.method == method and r.path == "/api/v1" + path]


def boot(cloud: FakeLambda, instance_id: str) -> None:
    cloud.instances[instance_id].created -= cloud.boot_seconds


# -- offers ---------------------------------------------------------------------------------------------------------


async def test_offers_are_one_per_region_with_gpu_count_vram_and_dollars(lam: LambdaProvider) -> None:
    offers = {o.offer_id: o for o in await lam.offers(OfferQuery())}

    assert set(offers) == {"gpu_1x_a10@us-east-1", "gpu_1x_a10@us-west-1", "gpu_1x_h100_pcie@us-west-1", "gpu_8x_a100@"}
    assert offers["gpu_1x_a10@us-east-1"] == Offer(
        ProviderName.LAMBDA, "gpu_1x_a10@us-east-1", "A10", "gpu_1x_a10", 1, 24.0, 0.75, False, None, "us-east-1", True
    )
    assert offers["gpu_1x_h100_pcie@us-west-1"].price_per_hour == 2.49
    no_capacity = offers["gpu_8x_a100@"]
    assert (no_capacity.gpu, no_capacity.count, no_capacity.vram_gb) == ("A100 SXM", 8, 40.0)
    assert (no_capacity.in_stock, no_capacity.location, no_capacity.price_per_hour) == (False, "", 10.32)


async def test_offers_filter_by_query_and_spot_asks_nothing(lam: LambdaProvider, cloud: FakeLambda) -> None:
    assert {o.location for o in await lam.offers(OfferQuery(gpu="a10"))} == {"us-east-1", "us-west-1"}
    assert [o.gpu_id for o in await lam.offers(OfferQuery(min_vram_gb=80))] == ["gpu_1x_h100_pcie"]
    assert [o.gpu_id for o in await lam.offers(OfferQuery(gpu="gpu_8x_a100"))] == ["gpu_8x_a100"]
    asked = len(cloud.requests)
    assert await lam.offers(OfferQuery(spot=True)) == []
    assert len(cloud.requests) == asked


@pytest.mark.parametrize(
    ("description", "parsed"),
    [
        ("1x A10 (24 GB PCIe)", (1, "A10", 24.0)),
        ("8x H100 (80 GB SXM5)", (8, "H100 SXM", 80.0)),
        ("8x Tesla V100 (16 GB)", (8, "V100", 16.0)),
        ("1x GH200 (96 GB)", (1, "GH200", 96.0)),
        ("2x RTX 6000 Ada (48 GB)", (2, "RTX 6000 Ada", 48.0)),
        ("4 vCPU, 16 GB RAM", None),
    ],
)
def test_descriptions_give_count_gpu_and_vram(description: str, parsed: tuple[int, str, float] | None) -> None:
    assert parse_description(description) == parsed


# -- create ---------------------------------------------------------------------------------------------------------


async def test_create_registers_the_key_once_and_launches_exactly_one(lam: LambdaProvider, cloud: FakeLambda) -> None:
    key = public_key()
    first = await lam.create(rent(key, "rentune-r1"))
    second = await lam.create(rent(key, "rentune-r2", "gpu_1x_a10@us-west-1"))

    assert [r.json() for r in calls(cloud, "POST", "/ssh-keys")] == [{"name": "rentune-r1-key", "public_key": key}]
    assert [r.json() for r in calls(cloud, "POST", "/instance-operations/launch")] == [
        {
            "region_name": region,
            "instance_type_name": "gpu_1x_a10",
            "ssh_key_names": ["rentune-r1-key"],
            "file_system_names": [],
            "name": label,
        }
        for region, label in [("us-east-1", "rentune-r1"), ("us-west-1", "rentune-r2")]
    ]
    assert (first.state, first.name, first.price_per_hour, first.gpu) == (
        InstanceState.STARTING,
        "rentune-r1",
        0.75,
        "A10",
    )
    assert first.instance_id != second.instance_id
    assert {i.label for i in cloud.instances.values()} == {"rentune-r1", "rentune-r2"}
    assert all("quantity" not in r.json() for r in calls(cloud, "POST", "/instance-operations/launch"))


def test_the_default_url_is_cloud_lambda_ai() -> None:
    default = inspect.signature(LambdaProvider).parameters["base_url"].default
    assert default == PROVIDERS[ProviderName.LAMBDA].default_url == "https://cloud.lambda.ai/api/v1"


async def test_a_taken_key_name_gets_a_unique_one(lam: LambdaProvider, cloud: FakeLambda) -> None:
    cloud.ssh_keys["k0"] = {"id": "k0", "name": "rentune-r1-key", "public_key": public_key()}

    await lam.create(rent(public_key()))

    (added,) = calls(cloud, "POST", "/ssh-keys")
    assert added.json()["name"].startswith("rentune-r1-key-")
    assert len(added.json()["name"]) <= 64


async def test_spot_is_refused_before_asking_lambda(lam: LambdaProvider, cloud: FakeLambda) -> None:
    request = RentRequest(offer(), public_key(), "rentune-r1", image="", bid_per_hour=0.5)
    with pytest.raises(ProviderError, match="Lambda has no spot instances; set spot = false"):
        await lam.create(request)
    assert cloud.requests == []


async def test_no_capacity_keeps_lambdas_message_and_removes_the_new_key(
    lam: LambdaProvider, cloud: FakeLambda
) -> None:
    with pytest.raises(NoCapacityError, match="Not enough capacity to fulfill launch request") as caught:
        await lam.create(rent(public_key(), offer_id="gpu_8x_a100@us-east-1"))
    assert "instance-operations/launch/insufficient-capacity" in str(caught.value)
    assert cloud.ssh_keys == {}
    assert cloud.instances == {}

    cloud.faults.out_of_stock = True
    with pytest.raises(NoCapacityError):
        await lam.create(rent(public_key()))
    with pytest.raises(NoCapacityError, match="not in stock in any region"):
        await lam.create(rent(public_key(), offer_id="gpu_8x_a100@"))


async def test_a_refused_key_is_an_auth_error_with_lambdas_words(
    lam: LambdaProvider, cloud: FakeLambda, clock: ManualClock
) -> None:
    cloud.faults.reject_key = True
    with pytest.raises(AuthError, match="API key was invalid, expired, or deleted"):
        await lam.check_key()
    wrong = LambdaProvider("wrong-key", transport=cloud.transport(), retry=QUICK, pacer=paced(clock))
    try:
        cloud.faults.reject_key = False
        with pytest.raises(AuthError):
            await wrong.offers(OfferQuery())
        await lam.check_key()
    finally:
        await wrong.aclose()


async def test_a_429_is_retried_once_then_answers(lam: LambdaProvider, cloud: FakeLambda) -> None:
    cloud.faults.rate_limit_once = True
    assert len(await lam.offers(OfferQuery())) == 4
    assert [r.path for r in cloud.requests] == ["/api/v1/instance-types"] * 2


async def test_a_rate_limited_launch_is_sent_again(
    lam: LambdaProvider, cloud: FakeLambda, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = cloud._launch
    limited = [True]

    def once(request: FakeRequest) -> FakeResponse:
        if limited.pop() if limited else False:
            return FakeResponse(
                429, {"error": {"code": "global/rate-limited", "message": "Too many"}}, {"Retry-After": "0"}
            )
        return launch(request)

    monkeypatch.setattr(cloud, "_launch", once)
    instance = await lam.create(rent(public_key()))

    assert len(calls(cloud, "POST", "/instance-operations/launch")) == 2
    assert list(cloud.instances) == [instance.instance_id]


def served(cloud: FakeLambda, path: str | None = None) -> list[float]:
    """When the fake served each request (to ``path``, if given), on the test's clock."""
    return [moment for moment, _method, where in cloud.served if path is None or where == path]


async def test_a_burst_of_calls_is_paced_at_lambdas_one_request_a_second(
    lam: LambdaProvider, cloud: FakeLambda, clock: ManualClock
) -> None:
    """Six calls at once go out one a second: the fake, which refuses faster ones with 429, serves every one."""
    start = clock.now()
    answers = await asyncio.gather(*(lam.get(f"no-such-{n}") for n in range(6)))
    assert [a.state for a in answers] == [InstanceState.TERMINATED] * 6
    times = served(cloud)
    assert len(times) == len(cloud.requests) == 6, "no request was refused"
    assert all(b - a >= REQUEST_INTERVAL_S - 1e-9 for a, b in itertools.pairwise(times))
    assert clock.now() - start == pytest.approx(5 * REQUEST_INTERVAL_S), "no longer than the limit asks"


async def test_a_launch_right_after_another_waits_out_lambdas_launch_window(
    lam: LambdaProvider, cloud: FakeLambda, clock: ManualClock
) -> None:
    key = public_key()
    first = await lam.create(rent(key, "rentune-r1"))
    second = await lam.create(rent(key, "rentune-r2"))
    launches = served(cloud, "/instance-operations/launch")
    assert len(launches) == 2 and launches[1] - launches[0] >= LAUNCH_INTERVAL_S - 1e-9
    assert len(cloud.requests) == len(cloud.served), "no request was refused"
    assert set(cloud.instances) == {first.instance_id, second.instance_id}


async def test_a_429_back_off_outlasts_a_launch_window(cloud: FakeLambda, clock: ManualClock) -> None:
    """Another client with the same key launched just now: this one's launch is refused with 429 until 12 s have
    passed, and its back-off (Lambda sends no Retry-After) waits longer than that instead of giving up.

    This client's pacer is left out (it would space the retried launch 12 s from the refused one by itself), so
    only the back-off waits.
    """
    other = LambdaProvider("test-key", transport=cloud.transport(), retry=QUICK, pacer=paced(clock))
    unpaced = Pacer(0.0, 0.0, clock=clock.now, sleep=clock.sleep)
    mine = LambdaProvider("test-key", transport=cloud.transport(), pacer=unpaced)  # the default back-off
    assert mine.retry == LAMBDA_RETRY
    key = public_key()
    try:
        await other.create(rent(key, "rentune-other"))
        await mine._ensure_key("rentune-mine", key)  # registered already: found, not added
        instance = await mine.create(rent(key, "rentune-mine"))
    finally:
        await other.aclose()
        await mine.aclose()
    launches = served(cloud, "/instance-operations/launch")
    sent = calls(cloud, "POST", "/instance-operations/launch")
    assert len(launches) == 2 and len(sent) > 2, "the launch was refused, then served"
    assert launches[1] - launches[0] >= LAUNCH_INTERVAL_S - 1e-9
    assert cloud.instances[instance.instance_id].label == "rentune-mine"


async def test_a_launch_answered_503_is_never_sent_twice(
    lam: LambdaProvider, cloud: FakeLambda, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = cloud._launch

    def launched_then_503(request: FakeRequest) -> FakeResponse:
        launch(request)
        return FakeResponse(503, {"error": {"code": "global/unknown", "message": "upstream timeout"}})

    monkeypatch.setattr(cloud, "_launch", launched_then_503)
    with pytest.raises(UncertainOutcomeError, match="upstream timeout"):
        await lam.create(rent(public_key()))
    assert len(calls(cloud, "POST", "/instance-operations/launch")) == 1
    [launched] = cloud.instances.values()

    [found] = await lam.named("rentune-r1")  # the caller looks it up by its name instead of launching again
    assert found.instance_id == launched.id and found.state is InstanceState.STARTING
    await lam.terminate(found.instance_id)
    assert cloud.ssh_keys == {}  # the key added for the launch goes with the machine

    monkeypatch.setattr(cloud, "_launch", lambda request: FakeResponse(503, {"error": {"message": "down"}}))
    with pytest.raises(UncertainOutcomeError):
        await lam.create(rent(public_key(), "rentune-r2"))
    assert len(calls(cloud, "POST", "/instance-operations/launch")) == 2
    assert await lam.named("rentune-r2") == []
    assert len(cloud.instances) == 1


async def test_a_launch_without_an_answer_is_not_sent_again(lam: LambdaProvider, cloud: FakeLambda) -> None:
    cloud.fail_next("POST", r"/instance-operations/launch", CallFault(FaultKind.TIMEOUT, after_acting=True), times=3)

    with pytest.raises(UncertainOutcomeError):
        await lam.create(rent(public_key()))

    assert len(calls(cloud, "POST", "/instance-operations/launch")) == 1
    assert [i.name for i in await lam.named("rentune-r1")] == ["rentune-r1"]


async def test_an_inactive_account_is_not_a_bad_key(lam: LambdaProvider, cloud: FakeLambda) -> None:
    cloud.account_inactive = True
    with pytest.raises(ProviderError) as caught:
        await lam.check_key()
    error = caught.value
    assert not isinstance(error, AuthError)
    assert "account is inactive" in error.message and "API key is fine" in error.message
    assert "payment method" in error.message and "global/account-inactive" in error.message
    with pytest.raises(ProviderError, match="account is inactive"):
        await lam.create(rent(public_key()))
    assert calls(cloud, "POST", "/instance-operations/launch") == []


# -- states, stop, terminate ----------------------------------------------------------------------------------------


async def test_booting_then_active_at_ubuntu_on_port_22(lam: LambdaProvider, cloud: FakeLambda) -> None:
    created = await lam.create(rent(public_key()))

    booting = await lam.get(created.instance_id)
    assert (booting.state, booting.ssh, booting.status_text) == (InstanceState.STARTING, None, "booting")

    boot(cloud, created.instance_id)
    active = await lam.get(created.instance_id)
    assert (active.state, active.status_text, active.name) == (InstanceState.RUNNING, "active", "rentune-r1")
    assert active.ssh == SshAddress("127.0.0.1", 22, "ubuntu")
    assert (active.price_per_hour, active.gpu) == (0.75, "A10")


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("booting", InstanceState.STARTING),
        ("active", InstanceState.RUNNING),
        ("unhealthy", InstanceState.RUNNING),
        ("preempted", InstanceState.STOPPED),
        ("terminating", InstanceState.TERMINATED),
        ("terminated", InstanceState.TERMINATED),
    ],
)
def test_every_lambda_status_is_mapped(status: str, state: InstanceState) -> None:
    row: dict[str, Any] = {"id": "i1", "name": "rentune-r1", "status": status, "ip": "10.1.2.3"}
    assert STATES[status] is state and instance_from(row, vm_ssh).state is state
    assert (state in LOST) == (status in {"preempted", "terminating", "terminated"})  # these end a wait at once


async def test_a_preempted_machine_is_lost_but_still_listed_until_terminated(
    lam: LambdaProvider, cloud: FakeLambda
) -> None:
    created = await lam.create(rent(public_key()))
    boot(cloud, created.instance_id)
    assert (await lam.get(created.instance_id)).state is InstanceState.RUNNING

    cloud.preempt(created.instance_id)

    preempted = await lam.get(created.instance_id)
    assert (preempted.state, preempted.status_text, preempted.ssh) == (InstanceState.STOPPED, "preempted", None)
    assert not cloud.pool.alive(created.instance_id)
    assert [i.instance_id for i in await lam.named("rentune-r1")] == [created.instance_id]
    await lam.terminate(created.instance_id)
    assert await lam.named("rentune-r1") == []


async def test_only_object_does_not_exist_means_gone(
    lam: LambdaProvider, cloud: FakeLambda, clock: ManualClock
) -> None:
    assert (await lam.get("no-such-instance")).state is InstanceState.TERMINATED
    await lam.terminate("no-such-instance")

    lost = LambdaProvider(
        "test-key", "https://cloud.lambda.ai/api/v2", transport=cloud.transport(), retry=QUICK, pacer=paced(clock)
    )
    try:
        with pytest.raises(ProviderError, match=r"cannot read instance abc: .*global/not-found"):
            await lost.get("abc")
        with pytest.raises(ProviderError, match=r"cannot terminate instance abc: .*global/not-found"):
            await lost.terminate("abc")
    finally:
        await lost.aclose()


async def test_the_fake_bills_from_launch_to_termination(lam: LambdaProvider, cloud: FakeLambda) -> None:
    created = await lam.create(rent(public_key()))
    cloud.instances[created.instance_id].extra["launched_at"] -= 30
    await lam.terminate(created.instance_id)
    billed = cloud.billed_seconds(created.instance_id)
    assert 30 <= billed < 40
    await asyncio.sleep(0.05)
    assert cloud.billed_seconds(created.instance_id) == billed


async def test_stop_is_refused_with_the_fix(lam: LambdaProvider, cloud: FakeLambda) -> None:
    with pytest.raises(ProviderError, match="Lambda has no stop; terminate instead"):
        await lam.stop("abc")
    assert cloud.requests == []


async def test_terminate_kills_the_machine_deletes_our_key_and_is_idempotent(
    lam: LambdaProvider, cloud: FakeLambda
) -> None:
    created = await lam.create(rent(public_key()))
    boot(cloud, created.instance_id)
    assert (await lam.get(created.instance_id)).state is InstanceState.RUNNING
    assert cloud.pool.alive(created.instance_id)

    await lam.terminate(created.instance_id)
    await lam.terminate(created.instance_id)
    await lam.terminate("no-such-instance")

    assert not cloud.pool.alive(created.instance_id)
    assert cloud.instances[created.instance_id].terminated is not None
    assert cloud.ssh_keys == {}
    assert (await lam.get(created.instance_id)).state is InstanceState.TERMINATED
    assert (await lam.get("no-such-instance")).state is InstanceState.TERMINATED


async def test_a_key_the_account_already_had_is_reused_and_kept(lam: LambdaProvider, cloud: FakeLambda) -> None:
    key = public_key()
    cloud.ssh_keys["k0"] = {"id": "k0", "name": "laptop", "public_key": key}

    created = await lam.create(rent(key + " me@laptop"))
    await lam.terminate(created.instance_id)

    assert calls(cloud, "POST", "/ssh-keys") == []
    assert calls(cloud, "POST", "/instance-operations/launch")[0].json()["ssh_key_names"] == ["laptop"]
    assert list(cloud.ssh_keys) == ["k0"]


async def test_instances_lists_every_machine_with_its_state(lam: LambdaProvider, cloud: FakeLambda) -> None:
    first = await lam.create(rent(public_key(), "rentune-r1"))
    second = await lam.create(rent(public_key(), "rentune-r2"))
    await lam.terminate(second.instance_id)

    listed = {i.instance_id: i for i in await lam.instances()}

    assert listed[first.instance_id].name == "rentune-r1"
    assert listed[first.instance_id].state is InstanceState.STARTING
    assert listed[second.instance_id].state is InstanceState.TERMINATED


def test_the_fake_refuses_more_than_one_machine_per_launch(cloud: FakeLambda, clock: ManualClock) -> None:
    with httpx.Client(transport=cloud.transport(), base_url="https://cloud.lambda.ai/api/v1") as client:
        headers = {"Authorization": "Bearer test-key"}
        client.post("/ssh-keys", json={"name": "k", "public_key": public_key()}, headers=headers)
        clock.time += REQUEST_INTERVAL_S  # Lambda serves one request a second
        body = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["k"], "quantity": 2}
        answer = client.post("/instance-operations/launch", json=body, headers=headers)
    assert answer.status_code == 400
    assert answer.json() == {
        "error": {"code": "global/invalid-parameters", "message": "quantity: Input should be less than or equal to 1"}
    }


# -- one real machine over real HTTP --------------------------------------------------------------------------------


async def test_a_rented_machine_takes_the_runs_key_over_ssh(tmp_path: Path, clock: ManualClock) -> None:
    cloud = FakeLambda(tmp_path / "lambda-http", boot_seconds=0.3, clock=clock.now)
    url = f"{cloud.serve()}/api/v1"
    provider = LambdaProvider("test-key", url, retry=QUICK, ssh_for=cloud.ssh_for, pacer=paced(clock))
    try:
        key = asyncssh.generate_private_key("ssh-ed25519")
        created = await provider.create(rent(key.export_public_key().decode()))
        instance = await wait_running(provider, created.instance_id)
        assert instance.ssh is not None
        machine = cloud.instances[created.instance_id].address
        assert machine is not None
        known = asyncssh.import_known_hosts(f"[{instance.ssh.host}]:{instance.ssh.port} {machine.host_public_key}")
        async with asyncssh.connect(
            instance.ssh.host,
            port=instance.ssh.port,
            username=instance.ssh.user,
            client_keys=[key],
            known_hosts=known,
        ) as connection:
            result = await connection.run("echo ok", check=True)
        assert result.stdout == "ok\n"

        await provider.terminate(created.instance_id)
        assert not cloud.pool.alive(created.instance_id)
        assert (await provider.get(created.instance_id)).state is InstanceState.TERMINATED
    finally:
        await provider.aclose()
        cloud.close()


async def wait_running(provider: LambdaProvider, instance_id: str) -> Instance:
    async with asyncio.timeout(20):
        while (instance := await provider.get(instance_id)).state is not InstanceState.RUNNING:
            await asyncio.sleep(0.1)
    return instance
