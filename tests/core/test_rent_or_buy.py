"""Rent or buy against a hand calculation: two cards, their yearly costs and break-even hours."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from desktop.core.costs.rent_or_buy import (
    OwnedCard,
    RentedSample,
    RentOrBuy,
    cards_from_json,
    rented_from_history,
    training_speed,
)
from desktop.core.sizing.gpus import GpuSpec
from desktop.services.platform.resources import resource_bytes

# Speeds are TFLOPS times the share reached: 1000 x 0.36 = 360 rented, 160 x 0.45 = 72 and 720 x 0.25 = 180 owned.
RENTED_GPU = GpuSpec("big", "Big", 80, 1000.0, "sxm", 3.5, 0.36)
CONSUMER = GpuSpec("consumer", "Consumer", 24, 160.0, "pcie", 0.7, 0.45)
DATACENTRE = GpuSpec("dc", "Datacentre", 80, 720.0, "pcie", 2.4, 0.25)


def _history() -> list[RentedSample]:
    """90 days: 50 h of training for $140 on one GPU, a failed run's $10 that never trained, 10 h for $30 on two."""
    return [
        RentedSample(50.0, 140.0, training_speed(RENTED_GPU), "Big", 80),
        RentedSample(0.0, 10.0, training_speed(RENTED_GPU), "Big", 80),
        RentedSample(10.0, 30.0, 360.0, "Big", 80),
    ]


def test_the_history_becomes_a_year_at_its_effective_training_hour() -> None:
    rented = rented_from_history(_history())
    assert rented is not None
    assert rented.history_hours == 60.0
    assert rented.hours_per_year == pytest.approx(60 * 365 / 90)  # 243.33 h
    assert rented.usd_per_training_hour == pytest.approx(180 / 60)  # $3.00: the failed run's dollars count
    assert rented.speed == pytest.approx(360.0)
    assert rented.gpu_names == ("Big",) and rented.vram_gib == 80
    assert rented_from_history([RentedSample(0.0, 10.0, 360.0, "Big", 80)]) is None, "no training: no rate"


def test_a_consumer_card_pays_back_above_190_hours_and_a_datacentre_card_above_1500() -> None:
    rented = rented_from_history(_history())
    assert rented is not None
    consumer = OwnedCard("c", "Consumer", CONSUMER, price_usd=1600, watts=600, resale_percent=50, years=2)
    weighed = RentOrBuy(rented, consumer, kwh_usd=0.30)
    # By hand: 360 / 72 = 5 owned hours per rented hour; 5 h x 0.6 kW x $0.30 = $0.90 of electricity per rented
    # hour; (1600 - 800) / 2 = $400 a year of lost value; break-even 400 / (3.00 - 0.90) = 190.48 h.
    assert weighed.hours_factor == pytest.approx(5.0)
    assert weighed.owned_usd_per_rented_hour == pytest.approx(0.90)
    assert consumer.loss_per_year_usd == pytest.approx(400.0)
    assert weighed.break_even_hours == pytest.approx(400 / 2.10)
    assert weighed.rent_usd(243.333) == pytest.approx(730.0, rel=1e-4)
    assert weighed.own_usd(243.333) == pytest.approx(400 + 0.9 * 243.333)  # $619
    assert weighed.owning_is_cheaper and weighed.owned_hours_per_year == pytest.approx(5 * 60 * 365 / 90)
    datacentre = OwnedCard("d", "Datacentre", DATACENTRE, price_usd=27000, watts=500, resale_percent=40, years=4)
    weighed = RentOrBuy(rented, datacentre, kwh_usd=0.30)
    # By hand: 360 / 180 = 2; 2 x 0.5 x 0.30 = $0.30; 27000 x 0.6 / 4 = $4,050; 4050 / (3.00 - 0.30) = 1,500 h.
    assert weighed.hours_factor == pytest.approx(2.0)
    assert weighed.break_even_hours == pytest.approx(1500.0)
    assert not weighed.owning_is_cheaper
    assert weighed.as_dict()["cheaper"] == "rent" and weighed.as_dict()["owned"]["usd_per_year"] == pytest.approx(
        4050 + 0.3 * 60 * 365 / 90
    )


def test_owning_never_pays_back_when_its_electricity_costs_more_than_the_rented_hour() -> None:
    rented = rented_from_history(_history())
    assert rented is not None
    consumer = OwnedCard("c", "Consumer", CONSUMER, price_usd=1600, watts=600, resale_percent=50, years=2)
    assert RentOrBuy(rented, consumer, kwh_usd=1.0).break_even_hours is None  # 5 x 0.6 x $1 = $3.00 a rented hour
    far = RentOrBuy(rented.with_hours(2000), consumer, kwh_usd=0.3)
    assert not far.fits_in_a_year, "10,000 card hours are more than a year has"


@given(
    price=st.floats(100, 50_000),
    watts=st.floats(50, 2_000),
    kwh=st.floats(0, 1),
    rate=st.floats(0.1, 10),
    resale=st.floats(0, 90),
)
def test_at_the_break_even_both_cost_the_same(
    price: float, watts: float, kwh: float, rate: float, resale: float
) -> None:
    rented = rented_from_history([RentedSample(10.0, 10.0 * rate, 360.0, "Big", 80)])
    assert rented is not None
    card = OwnedCard("c", "C", CONSUMER, price_usd=price, watts=watts, resale_percent=resale, years=3)
    weighed = RentOrBuy(rented, card, kwh_usd=kwh)
    even = weighed.break_even_hours
    if even is None:
        assert weighed.owned_usd_per_rented_hour >= rate * (1 - 1e-9)
    else:
        assert weighed.rent_usd(even) == pytest.approx(weighed.own_usd(even), rel=1e-9)
        assert weighed.rent_usd(even * 1.1) > weighed.own_usd(even * 1.1)


def test_the_shipped_cards_table_reads_with_a_source_for_every_card() -> None:
    data = json.loads(resource_bytes("owned_cards.json"))
    rtx4090 = GpuSpec("rtx4090", "RTX 4090", 24, 165.0, "pcie", 0.69, 0.44)
    table = cards_from_json(data, [CONSUMER, rtx4090])
    assert [card.id for card in table.cards] == ["rtx4090"], "cards whose GPU type is unknown are left out"
    assert table.cards[0].watts == data["cards"][1]["card_watts"] + data["rest_of_computer_watts"]
    assert all(card["source"] for card in data["cards"]) and table.sources and data["checked"]
    with pytest.raises(ValueError, match="lacks 'price_usd'"):
        cards_from_json({**data, "cards": [{"id": "x", "name": "X", "gpu_id": "rtx4090"}]}, [rtx4090])
