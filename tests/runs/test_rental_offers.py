"""What the driver rents and books against what the provider bills: a Vast spot machine bid on its machine part and
booked with its disk, and a pod that runs without a public SSH port let go for the next offer."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import RentalState
from desktop.services.providers.base import InstanceState, OfferQuery, ProviderName, RentRequest
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.providers.vast import VastProvider
from tests.fakes.memory_cloud import offer
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast
from tests.runs.rental_world import (
    World,
    ssh_always_greets,  # noqa: F401 - autouse: machines greet at once
    trains_to_the_end,
)

FAST = RetryPolicy(first_delay=0.01)


async def test_a_vast_spot_machine_is_bid_on_its_machine_part_and_booked_with_its_disk(tmp_path: Path) -> None:
    """Offer 5001 with 100 GB: min_bid $0.18 and storage $0.144 per GB per month ($0.02 an hour). The bid sent is
    5 % over min_bid, the disk billed on top; the ledger's rate and dollars are what the fake bills."""
    fake = FakeVast(tmp_path / "vast", boot_seconds=600)  # billing, never booted: its end is not an sshd's kill
    vast = VastProvider("test-key", "http://vast.test/api/v0", transport=fake.transport(), retry=FAST)
    world = World(tmp_path)
    world.clouds[ProviderName.VAST] = vast  # type: ignore[assignment]
    compute = ComputeSpec("vast", gpu="RTX 4090", spot=True, disk_gb=100)
    run_id = world.create(compute)
    try:
        [spot] = await vast.offers(OfferQuery(gpu="RTX 4090", spot=True, disk_gb=100))
        assert spot.price_per_hour == pytest.approx(0.20) and spot.storage_per_hour == pytest.approx(0.02)
        instance = await world.driver._create(run_id, compute, spot)
        booked = fake.instances[instance.instance_id]
        assert booked.extra["price"] == pytest.approx(0.18 * 1.05), "the bid leaves the disk out"
        assert booked.price_per_hour == pytest.approx(0.18 * 1.05 + 0.02), "Vast bills the disk on top"
        [row] = world.ledger.rentals(run_id)
        assert row.price_per_hour == pytest.approx(booked.price_per_hour)
        await asyncio.sleep(4.0)  # 1 % of it (40 ms) is well above the ~10 ms between the fake's end and its answer
        assert await world.terminator.until_gone(vast, instance.instance_id)
    finally:
        await vast.aclose()
        fake.close()
    [row] = world.ledger.rentals(run_id)
    assert row.state is RentalState.ENDED and row.stopped is not None
    assert row.usd(row.stopped) == pytest.approx(fake.billed_usd(instance.instance_id), rel=0.01)


async def test_a_pod_running_without_a_public_ssh_port_is_let_go_after_the_grace_for_the_next_offer(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    grace = 0.3
    world.driver.options = replace(world.driver.options, public_port_grace_seconds=grace)
    world.runpod._offers = [
        offer(ProviderName.RUNPOD, "community", 0.20, spot=False),
        offer(ProviderName.RUNPOD, "secure", 0.30, spot=False),
    ]
    world.runpod.no_public_port_for = {"community"}
    world.runpod.on_create = lambda host: setattr(host, "on_launch", trains_to_the_end)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090"))  # ready timeout: 10 minutes

    final = await asyncio.wait_for(world.driver.drive(run_id), 60)

    assert final.state is RunState.FINISHED, final.error
    machines = world.engine.store.get(run_id).spec["machines"]
    assert [m["instance_id"] for m in machines] == ["runpod-1", "runpod-2"]
    assert "without a public SSH port" in machines[0]["why"] and machines[1]["why"] == "the adapter is home"
    assert world.runpod.terminated == ["runpod-1", "runpod-2"] and world.runpod.live() == []
    assert [r.offer.offer_id for r in world.runpod.requests] == ["community", "secure"]
    assert world.runpod.billed_seconds("runpod-1") >= grace, "it had its grace"
    for row in world.ledger.rentals(run_id):
        assert row.instance_id is not None and row.state is RentalState.ENDED
        billed = world.runpod.billed_seconds(row.instance_id) * row.price_per_hour / 3600
        assert row.usd(world.runpod.clock()) == pytest.approx(billed, rel=0.01, abs=1e-9)


async def test_a_runpod_pod_on_a_host_without_a_public_ip_runs_with_no_ssh_address(tmp_path: Path) -> None:
    """RunPod's v2 pod: RUNNING, ``ssh.direct`` null and no public port for 22/tcp: running, but no address."""
    fake = FakeRunPod(tmp_path / "runpod", boot_seconds=0.1)
    fake.no_public_ip_clouds = {"COMMUNITY"}
    client = RunPodProvider(fake.valid_key, transport=fake.transport(), retry=FAST)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample run"
    try:
        found = await client.offers(OfferQuery(gpu="RTX 4090"))
        made = {}
        for cloud in ("community", "secure"):
            chosen = next(o for o in found if o.location.startswith(cloud))
            made[cloud] = await client.create(RentRequest(chosen, key, f"rentune-{cloud}", "runpod/pytorch"))
        deadline = time.monotonic() + 15
        while (pods := {c: await client.get(i.instance_id) for c, i in made.items()}) and any(
            p.state is not InstanceState.RUNNING for p in pods.values()
        ):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert pods["community"].ssh is None and pods["secure"].ssh is not None
        with fake.lock:
            body = fake.pod_of(fake.instances[made["community"].instance_id])
        assert body["status"] == "RUNNING" and body["ssh"]["direct"] is None and body["cost"] > 0
        assert body["runtime"]["ports"] == [{"private": 22, "public": None, "type": "tcp", "ip": None}]
    finally:
        await client.aclose()
        fake.close()
