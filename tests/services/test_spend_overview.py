"""What was spent today, this month, per provider, per month and per run: the ledger's rentals and own servers at
their rate, counted the way run_spend counts one run."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

import pytest

from desktop.core.runs.progress import billable_seconds
from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.spend import (
    OWN_SERVER,
    billing_intervals,
    day_starts,
    month_starts,
    run_spend,
    spend_overview,
)
from desktop.services.runs.store import RunStore
from tests.fixtures.recorded_costs import backdated_run

HOUR = 3600.0


def at(*parts: int) -> float:
    """A local time, as the computer's calendar has it."""
    return datetime(*parts).timestamp()  # type: ignore[arg-type]


def _rented_run(store: RunStore, provider: str = "runpod") -> str:
    compute = asdict(ComputeSpec(provider=provider, gpu="RTX 4090"))
    return store.create({"compute": compute, "base_model": "m"}, None).id


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


def test_today_and_this_month_count_only_the_part_of_each_rental_inside_them(ledger: Ledger) -> None:
    store = RunStore()
    run_id = _rented_run(store)
    now = at(2026, 12, 15, 12, 0)
    ledger.open(run_id, "runpod", "before", "RTX 4090", 1.0, started=at(2026, 11, 30, 22, 0))
    ledger.close("runpod", "before", stopped=at(2026, 12, 1, 2, 0))  # 2 h in November, 2 h in December
    ledger.open(run_id, "runpod", "yesterday", "RTX 4090", 2.0, started=at(2026, 12, 14, 23, 0))
    ledger.close("runpod", "yesterday", stopped=at(2026, 12, 15, 1, 0))  # 1 h yesterday, 1 h today
    ledger.open(run_id, "runpod", "live", "RTX 4090", 0.5, started=at(2026, 12, 15, 10, 0))  # 2 h so far
    overview = spend_overview(store, ledger=ledger, now=now)
    assert overview.today_usd == pytest.approx(2.0 + 1.0)
    assert overview.month_usd == pytest.approx(2.0 + 4.0 + 1.0)
    assert overview.total_usd == pytest.approx(4.0 + 4.0 + 1.0)
    assert overview.burn_per_hour == pytest.approx(0.5)
    assert [charge.instance_id for charge in overview.billing] == ["live"]
    november, december = overview.months[-2:]
    assert november.usd == pytest.approx(2.0) and december.usd == pytest.approx(7.0)
    assert overview.days[-1].usd == pytest.approx(overview.today_usd)
    assert overview.days[-2].usd == pytest.approx(2.0)  # yesterday's hour at $2


def test_own_servers_count_at_their_rate_per_provider_and_agree_with_run_spend(ledger: Ledger) -> None:
    store = RunStore()
    start = at(2026, 10, 3, 9, 0)
    history = [
        (RunState.PLANNED, start - 60),
        (RunState.CONNECTING, start),
        (RunState.TRAINING, start + HOUR),
        (RunState.PAUSED, start + 2 * HOUR),  # a lost connection ends the bill for a while
        (RunState.CONNECTING, start + 5 * HOUR),
        (RunState.FINISHED, start + 6 * HOUR),
    ]
    own = backdated_run(store, {"hourly_rate_usd": 1.5, "base_model": "m"}, history, "ssh://me@box:22")
    free = backdated_run(store, {"hourly_rate_usd": 0.0}, history, "ssh://me@box:22", run_id="free-run")
    rented = _rented_run(store, "vast")
    ledger.open(rented, "vast", "v1", "A100", 1.0, started=start)
    ledger.close("vast", "v1", stopped=start + 3 * HOUR)
    now = at(2026, 12, 15, 12, 0)
    overview = spend_overview(store, ledger=ledger, now=now)
    assert dict(overview.by_provider) == pytest.approx({OWN_SERVER: 3 * 1.5, "vast": 3.0})
    assert overview.by_provider[0][0] == OWN_SERVER, "highest first"
    by_run = {cost.run_id: cost for cost in overview.runs}
    assert set(by_run) == {own, rented}, "a run that cost nothing is not listed"
    assert by_run[own].spend.usd == pytest.approx(run_spend(store, own, now=now).usd)
    assert by_run[rented].spend.usd == pytest.approx(run_spend(store, rented, ledger=ledger, now=now).usd)
    assert by_run[own].providers == (OWN_SERVER,)
    october = next(month for month in overview.months if datetime.fromtimestamp(month.start).month == 10)
    assert dict(october.by_provider) == pytest.approx({OWN_SERVER: 4.5, "vast": 3.0})
    assert free not in by_run


def test_a_deleted_runs_rentals_still_count(ledger: Ledger) -> None:
    store = RunStore()
    ledger.open("20250101-000000-gone", "lambda", "l1", "H100", 3.0, started=at(2026, 12, 1, 8, 0))
    ledger.close("lambda", "l1", stopped=at(2026, 12, 1, 9, 0))
    overview = spend_overview(store, ledger=ledger, now=at(2026, 12, 2, 8, 0))
    [cost] = overview.runs
    assert cost.record is None and cost.spend.usd == pytest.approx(3.0) and cost.providers == ("lambda",)
    assert overview.total_usd == pytest.approx(3.0)


def test_a_runs_rentals_count_though_its_spec_no_longer_names_a_provider_or_a_rate(ledger: Ledger) -> None:
    run = RunStore().create({"base_model": "m"}, "ssh://me@own-box:22")  # moved to a server of the user's, no rate
    ledger.open(run.id, "runpod", "p1", "RTX 4090", 0.5, started=at(2026, 12, 1, 8, 0))
    ledger.close("runpod", "p1", stopped=at(2026, 12, 1, 10, 0))
    overview = spend_overview(RunStore(), ledger=ledger, now=at(2026, 12, 2, 8, 0))
    [cost] = overview.runs
    assert cost.run_id == run.id and cost.spend.usd == pytest.approx(1.0) and cost.providers == ("runpod",)


def test_nothing_spent_is_an_empty_overview(ledger: Ledger) -> None:
    overview = spend_overview(RunStore(), ledger=ledger, now=at(2026, 6, 1, 12, 0))
    assert overview.empty and overview.total_usd == 0 and overview.runs == () and len(overview.months) == 12
    assert len(overview.days) == 30 and all(day.usd == 0 for day in overview.days)


def test_billing_intervals_add_up_to_billable_seconds() -> None:
    rows = [
        {"ts": 0, "to_state": "planned"},
        {"ts": 10, "to_state": "connecting"},
        {"ts": 50, "to_state": "training"},
        {"ts": 70, "to_state": "failed"},
        {"ts": 100, "to_state": "provisioning"},
        {"ts": 130, "to_state": "paused"},
        {"ts": 200, "to_state": "connecting"},
    ]
    intervals = billing_intervals(rows)
    assert intervals == [(10, 70), (100, 130), (200, None)]
    now = 260.0
    assert sum((stop if stop is not None else now) - start for start, stop in intervals) == billable_seconds(rows, now)


def test_calendar_bounds_are_local_midnights() -> None:
    now = at(2026, 3, 1, 0, 30)
    days = day_starts(now, 3)
    assert days == [at(2026, 2, 27), at(2026, 2, 28), at(2026, 3, 1), at(2026, 3, 2)]
    assert month_starts(now, 3) == [at(2026, 1, 1), at(2026, 2, 1), at(2026, 3, 1), at(2026, 4, 1)]
    assert month_starts(at(2026, 1, 10), 2) == [at(2025, 12, 1), at(2026, 1, 1), at(2026, 2, 1)]


def test_a_cluster_bills_per_machine_and_is_one_machine_to_stop(ledger: Ledger) -> None:
    """Each machine of a rented cluster has its own rental and dollars; the meter shows the cluster as one machine
    the run owns (stopping it deletes every machine), and RunPod's listing of it is no orphan."""
    from desktop.services.billing.meter import billing_machines
    from desktop.services.billing.rentals import Rental
    from desktop.services.providers.base import Instance, InstanceState, ProviderName

    store = RunStore()
    run_id = _rented_run(store)
    intent = ledger.intend(run_id, "runpod", "rentune-x-" + run_id, "8x H100 SXM", 40.0, "H100|CLUSTER|8|2", nodes=2)
    start = ledger.created(intent.id, "cluster:c1", started=1_000.0).started
    rental = Rental(ProviderName.RUNPOD, "cluster:c1", "2 machines x 8x H100 SXM", 40.0, False, "o", start)
    store.update(run_id, spec={**store.get(run_id).spec, "rental": rental.as_dict()})
    overview = spend_overview(store, ledger=ledger, now=start + HOUR)
    assert [(c.instance_id, c.rate_per_hour, c.usd(start + HOUR)) for c in overview.billing] == [
        ("cluster:c1/0", 20.0, pytest.approx(20.0)),
        ("cluster:c1/1", 20.0, pytest.approx(20.0)),
    ]
    listed = Instance(ProviderName.RUNPOD, "cluster:c1", "rentune-x", InstanceState.RUNNING, 40.0)
    (machine,) = billing_machines(overview, store.all(), [listed])
    assert (machine.instance_id, machine.gpu, machine.rate_per_hour, machine.owned) == (
        "cluster:c1",
        "2 machines x 8x H100 SXM",
        40.0,
        True,
    )
    assert machine.usd == pytest.approx(40.0) and machine.machines == 2
