"""A run's spend, the one answer every page and the tray give: the ledger for rented runs, the rate otherwise."""

from __future__ import annotations

from dataclasses import asdict

from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.spend import run_spend
from desktop.services.runs.store import RunStore


def _own_run(store: RunStore, rate: float) -> str:
    record = store.create({"hourly_rate_usd": rate}, "ssh://me@box:22")
    store.transition(record.id, RunState.CONNECTING)
    return record.id


def test_an_own_server_run_is_metered_at_its_rate_while_it_bills() -> None:
    store = RunStore()
    run_id = _own_run(store, 2.0)
    started = store.transitions(run_id)[-1]["ts"]
    spend = run_spend(store, run_id, now=started + 1800)
    assert round(spend.usd, 6) == 1.0
    assert spend.billing and not spend.rented and spend.rate_per_hour == 2.0


def test_an_ended_own_server_run_stops_billing_at_its_end() -> None:
    store = RunStore()
    run_id = _own_run(store, 2.0)
    store.transition(run_id, RunState.FAILED)
    ended = store.transitions(run_id)[-1]["ts"]
    later = run_spend(store, run_id, now=ended + 10_000)
    assert later.usd == run_spend(store, run_id, now=ended).usd
    assert not later.billing and later.rate_per_hour == 0.0


def test_no_rate_costs_nothing_and_bills_nothing() -> None:
    store = RunStore()
    run_id = _own_run(store, 0.0)
    spend = run_spend(store, run_id, now=store.transitions(run_id)[-1]["ts"] + 3600)
    assert spend.usd == 0.0 and not spend.billing


def test_a_rented_run_counts_the_ledger_of_every_machine_it_rented() -> None:
    store, ledger = RunStore(), Ledger()
    compute = asdict(ComputeSpec(provider="runpod", gpu="RTX 4090"))
    record = store.create({"compute": compute, "hourly_rate_usd": 9.0}, None)
    ledger.open(record.id, "runpod", "pod-a", "RTX 4090", 0.60, started=1000.0)
    ledger.close("runpod", "pod-a", stopped=1000.0 + 3600)  # spot machine taken away after an hour
    ledger.open(record.id, "runpod", "pod-b", "RTX 4090", 0.80, started=5000.0)
    spend = run_spend(store, record.id, ledger=ledger, now=5000.0 + 1800)
    assert round(spend.usd, 6) == 0.60 + 0.40
    assert spend.rented and spend.billing and spend.rate_per_hour == 0.80
    assert [rental.instance_id for rental in spend.rentals] == ["pod-a", "pod-b"]
