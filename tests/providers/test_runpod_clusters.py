"""RunPod Instant Clusters through REST v2 against the fake: offers, one create, members with ranks and overlay
addresses, one delete for every pod (in-process transport; the members boot real sshds)."""

from __future__ import annotations

import asyncio
import time

import asyncssh
import pytest

from desktop.services.providers.base import InstanceState, NoClustersError, OfferQuery, ProviderName, RentRequest
from desktop.services.providers.lambda_cloud import LambdaProvider
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.providers.runpod_clusters import cluster_id_of, members_from, parse_cluster_offer_id
from desktop.services.providers.vast import VastProvider
from tests.fakes.runpod import FakeRunPod


@pytest.fixture
def provider(runpod_client: RunPodProvider) -> RunPodProvider:
    """The real RunPod client on the shared fake (tests/conftest.py's ``runpod_client``)."""
    return runpod_client


async def test_a_cluster_offer_is_priced_for_every_pod_and_rents_as_one_machine(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    offers = await provider.offers(OfferQuery(gpu="RTX 4090", count=2, nodes=3))
    (offer,) = offers
    assert (offer.count, offer.nodes, offer.price_per_hour) == (2, 3, pytest.approx(0.69 * 2 * 3))
    assert parse_cluster_offer_id(offer.offer_id) == ("NVIDIA GeForce RTX 4090", 2, 3)
    assert "Instant Cluster" in offer.location
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    instance = await provider.create(RentRequest(offer, key, "rentune-x-run1", "runpod/pytorch", disk_gb=40))
    assert instance.instance_id.startswith("cluster:") and instance.state is InstanceState.STARTING
    assert instance.price_per_hour == pytest.approx(offer.price_per_hour)
    (create,) = [r for r in fake_runpod.requests if r.method == "POST" and r.path == "/v2/clusters"]
    body = create.json()
    assert body["type"] == "TRAINING" and body["compute"] == {
        "gpuTypeId": "NVIDIA GeForce RTX 4090",
        "gpuCountPerPod": 2,
        "podCount": 3,
    }
    assert "cloud" not in body and body["env"]["PUBLIC_KEY"] == key.strip()
    deadline = time.monotonic() + 30
    while (await provider.get(instance.instance_id)).state is not InstanceState.RUNNING:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    members = await provider.members(instance.instance_id)
    assert [m.rank for m in members] == [0, 1, 2] and all(m.address == "127.0.0.1" and m.ssh for m in members)
    assert len({m.ssh.port for m in members if m.ssh}) == 3, "each member its own machine"
    pods = await provider.instances()
    assert [i.instance_id for i in pods] == [instance.instance_id], "the cluster is listed, not its pods"
    (named,) = await provider.named("rentune-x-run1")
    assert named.instance_id == instance.instance_id and named.state is InstanceState.RUNNING
    assert named.price_per_hour == pytest.approx(0.69 * 2 * 3), "listed at its pods' cost together"
    await provider.terminate(instance.instance_id)
    assert (await provider.get(instance.instance_id)).state is InstanceState.TERMINATED
    assert not fake_runpod.pool.servers, "every member's machine went with the one delete"
    await provider.terminate(instance.instance_id)  # already gone: no error


async def test_a_member_that_stops_running_makes_the_cluster_lost(
    fake_runpod: FakeRunPod, provider: RunPodProvider
) -> None:
    (offer,) = await provider.offers(OfferQuery(gpu="RTX 4090", count=1, nodes=2))
    instance = await provider.create(RentRequest(offer, "ssh-ed25519 AAAA x", "rentune-x-run2", "img"))
    member = fake_runpod.clusters[cluster_id_of(instance.instance_id)].members[1]
    fake_runpod.statuses[member] = "EXITED"
    lost = await provider.get(instance.instance_id)
    assert lost.state is InstanceState.FAILED and "EXITED" in lost.status_text


def test_members_with_no_rank_or_a_strange_one_are_left_out() -> None:
    body = {
        "pods": [
            {"id": "a", "cluster": {"rank": 1, "ip": "10.65.0.3"}, "status": "RUNNING"},
            {"id": "b", "cluster": {"rank": 0, "ip": "10.65.0.2 --main_process_port=1"}, "status": "STARTING"},
            {"id": "c", "cluster": {"rank": "0; rm -rf /"}},
            {"id": "d", "cluster": {"rank": True}},
            {"id": "e"},
        ]
    }
    members = members_from(body, lambda _pod: None)
    assert [(m.pod_id, m.rank, m.address) for m in members] == [("b", 0, None), ("a", 1, "10.65.0.3")]


@pytest.mark.parametrize("client", [VastProvider, LambdaProvider])
async def test_a_provider_without_a_cluster_api_says_so_in_one_line(client: type) -> None:
    provider = client("key")
    try:
        with pytest.raises(NoClustersError) as refused:
            await provider.offers(OfferQuery(count=8, nodes=2))
    finally:
        await provider.aclose()
    assert refused.value.provider in {ProviderName.VAST, ProviderName.LAMBDA}
    assert "no API for renting several machines as one cluster" in str(refused.value) and "\n" not in str(refused.value)
