"""What the driver rents and books against what the provider bills: a Vast spot machine bid on its machine part and
booked with its disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.core.runs.spec import ComputeSpec
from desktop.services.billing.ledger import RentalState
from desktop.services.providers.base import OfferQuery, ProviderName
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.vast import VastProvider
from tests.fakes.vast import FakeVast
from tests.runs.rental_world import (
    World,
    ssh_always_greets,  # noqa: F401 - autouse: machines greet at once
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
