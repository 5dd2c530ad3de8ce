"""Rent or buy read from the user's own last 90 days: the ledger, each run's history, the GPU catalog."""

from __future__ import annotations

import pytest

from desktop.core.costs.rent_or_buy import training_speed
from desktop.core.runs.states import RunState
from desktop.core.settings import RentOrBuyChoice
from desktop.core.sizing.gpus import find_gpu
from desktop.services.billing.ledger import Ledger
from desktop.services.models.configs import load_gpus
from desktop.services.runs.rent_or_buy import RentOrBuyError, rent_or_buy, rented_gpu
from desktop.services.runs.store import RunStore
from tests.fixtures.recorded_run import backdate

NOW = 1_800_000_000.0
DAY = 86400.0


def _run(store: RunStore, ledger: Ledger, gpu: str, price: float, start: float, billed: float, trained: float) -> str:
    """A run that rented ``gpu`` at ``start`` for ``billed`` seconds, training ``trained`` of them after 600 s."""
    run = store.create({"base_model": "x"}, None)
    states = [RunState.PROVISIONING, *([RunState.TRAINING, RunState.PULLING] if trained else []), RunState.FAILED]
    for state in states:
        store.transition(run.id, state)
    times = [start - 1, start, *([start + 600, start + 600 + trained] if trained else []), start + billed]
    backdate(store, run.id, times)
    ledger.open(run.id, "runpod", f"pod-{run.id}", gpu, price, started=start)
    ledger.close("runpod", f"pod-{run.id}", stopped=start + billed)
    return run.id


def _seed() -> tuple[RunStore, Ledger]:
    store, ledger = RunStore(), Ledger()
    _run(store, ledger, "H100 SXM", 3.60, NOW - 30 * DAY, 10_000, 8_000)  # $10.00, 2.22 h trained
    _run(store, ledger, "2x H100 SXM", 7.20, NOW - 10 * DAY, 3_600, 1_800)  # $7.20, 0.5 h on two GPUs
    _run(store, ledger, "RTX 4090", 0.69, NOW - 5 * DAY, 3_600, 0)  # $0.69 that never trained
    _run(store, ledger, "Quantum X1", 9.99, NOW - 5 * DAY, 3_600, 1_800)  # a GPU type nobody knows
    _run(store, ledger, "H100 SXM", 3.60, NOW - 100 * DAY, 10_000, 8_000)  # before the 90 days
    return store, ledger


def test_the_last_90_days_become_a_year_at_their_effective_training_hour() -> None:
    store, ledger = _seed()
    report = rent_or_buy(RentOrBuyChoice(card="rtx4090"), store, ledger=ledger, now=NOW)
    gpus = list(load_gpus())
    h100 = find_gpu(gpus, "h100-sxm")
    assert h100 is not None and report.comparison is not None and report.history is not None
    hours = 8000 / 3600 + 0.5
    assert report.history.history_hours == pytest.approx(hours)
    assert report.history.hours_per_year == pytest.approx(hours * 365 / 90)
    assert report.history.usd_per_training_hour == pytest.approx((10.0 + 7.2 + 0.69) / hours)
    two = training_speed(h100, 2)
    assert two == pytest.approx(2 * training_speed(h100) * 0.9), "1.8x for two GPUs"
    assert report.history.speed == pytest.approx((8000 / 3600 * training_speed(h100) + 0.5 * two) / hours)
    assert report.left_out == 1 and report.history.gpu_names == ("H100 SXM",)
    assert report.comparison.kwh_usd == report.table.kwh_usd and report.card.id == "rtx4090"


def test_a_gpu_type_chosen_at_list_price_does_the_same_work_in_its_own_hours() -> None:
    store, ledger = _seed()
    history = rent_or_buy(RentOrBuyChoice(), store, ledger=ledger, now=NOW).history
    report = rent_or_buy(RentOrBuyChoice(rent_gpu="a100-80gb", kwh_usd=0.1), store, ledger=ledger, now=NOW)
    a100 = find_gpu(list(load_gpus()), "a100-80gb")
    assert a100 is not None and history is not None and report.comparison is not None
    rented = report.comparison.rented
    assert rented.hours_per_year == pytest.approx(history.hours_per_year * history.speed / training_speed(a100))
    assert rented.usd_per_training_hour == a100.list_price_usd_per_h and rented.history_hours is None
    assert report.comparison.kwh_usd == 0.1


def test_with_no_rented_training_it_asks_for_hours_and_unknown_names_say_what_is_known() -> None:
    store, ledger = RunStore(), Ledger()
    report = rent_or_buy(RentOrBuyChoice(), store, ledger=ledger, now=NOW)
    assert report.comparison is None and "give the hours of training you expect" in report.missing
    typed = rent_or_buy(RentOrBuyChoice(hours_per_year=500, price_usd=1000), store, ledger=ledger, now=NOW)
    assert typed.comparison is not None and typed.comparison.rented.gpu_names == ("H100 SXM",)
    assert typed.comparison.card.price_usd == 1000, "the user's figure replaces the table's"
    with pytest.raises(RentOrBuyError, match=r"no card 'rtx9090'.*rtx4090"):
        rent_or_buy(RentOrBuyChoice(card="rtx9090"), store, ledger=ledger, now=NOW)
    with pytest.raises(RentOrBuyError, match=r"no GPU type 'tpu'.*h100-sxm"):
        rent_or_buy(RentOrBuyChoice(rent_gpu="tpu", hours_per_year=5), store, ledger=ledger, now=NOW)


def test_rented_gpu_labels_name_the_type_and_the_count() -> None:
    gpus = list(load_gpus())
    assert rented_gpu(gpus, "2x H100 SXM")[1] == 2 and rented_gpu(gpus, "RTX 4090") == (find_gpu(gpus, "rtx4090"), 1)
    assert rented_gpu(gpus, "8x Quantum X1") == (None, 8)


def test_the_default_rented_gpus_name_is_the_catalogs() -> None:
    from desktop.services.runs.rent_or_buy import DEFAULT_RENTED_GPU, DEFAULT_RENTED_NAME

    gpu = find_gpu(list(load_gpus()), DEFAULT_RENTED_GPU)
    assert gpu is not None and gpu.name == DEFAULT_RENTED_NAME


def test_this_computer_is_weighed_at_the_speed_its_newest_trial_measured() -> None:
    store, ledger = RunStore(), Ledger()
    assert rent_or_buy(RentOrBuyChoice(hours_per_year=100), store, ledger=ledger, now=NOW).table.cards[0].id != (
        "this-computer"
    ), "no trial: no measured speed"
    trial = {"backend": "cpu", "achieved_tflops": 0.05, "memory_gb": 24.0}
    store.record_finished({"base_model": "x", "trial": trial}, started=NOW - 100, trained=(NOW - 90, NOW - 10))
    slow = rent_or_buy(RentOrBuyChoice(card="this-computer", hours_per_year=100), store, ledger=ledger, now=NOW)
    h100 = find_gpu(list(load_gpus()), "h100-sxm")
    assert h100 is not None and slow.comparison is not None and slow.table.cards[0].id == "this-computer"
    assert slow.card.name == "This computer (its CPU)" and "measured by your newest trial, run " in slow.card.source
    assert slow.comparison.hours_factor == pytest.approx(training_speed(h100) / 0.05)
    assert slow.comparison.break_even_hours is None, "its power for thousands of hours costs more than an H100 hour"
    assert not slow.comparison.fits_in_a_year and slow.card.owning_words.startswith("training on this computer")
    fast = {"backend": "gpu", "achieved_tflops": 300.0, "memory_gb": 80.0}
    store.record_finished({"base_model": "x", "trial": fast}, started=NOW - 5, trained=(NOW - 4, NOW - 1))
    quick = rent_or_buy(RentOrBuyChoice(card="this-computer", hours_per_year=100), store, ledger=ledger, now=NOW)
    assert quick.comparison is not None and quick.comparison.break_even_hours == 0.0, "already paid for"
    assert quick.comparison.owning_is_cheaper and quick.card.gpu.vram_gib == 80.0
