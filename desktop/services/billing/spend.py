"""What a run has cost so far: the one answer every page, the tray and the CLI give.

A rented run's dollars come from the ledger (price times time of each machine it rented, the count the budget stop
uses); a run on the user's own server is metered at the hourly rate they stated, over the time it billed (from
reaching the machine until it ended or paused). Asking twice at the same ``now`` gives the same cents everywhere.

The same stretches of billing (:class:`Charge`) add up to what the Costs page and the tray show: spend today, this
month, per provider, per month and per day (:func:`spend_overview`). Days and months are the computer's local ones.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from desktop.core.runs.progress import BILLING_ENDS, BILLING_STARTS, billable_seconds, billing_now
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger, Rental
from desktop.services.billing.records import RunRow, RunRows
from desktop.services.billing.rentals import compute_of

#: The provider key of runs on the user's own servers, metered at the hourly rate they stated.
OWN_SERVER = "own"


@dataclass(frozen=True)
class RunSpend:
    """A run's spend as of ``now``.

    Attributes:
        run_id: The run.
        usd: Dollars so far.
        rate_per_hour: What it costs per hour now (the running machine's price, or the stated rate); 0 when nothing
            bills or no rate is known.
        billing: Whether money is being spent now (a rented machine still running, or a live run at a stated rate).
        rented: Whether the dollars come from rented machines (the ledger) rather than a stated rate.
        rentals: The machines rented for the run, oldest first (empty for the user's own server).
    """

    run_id: str
    usd: float
    rate_per_hour: float
    billing: bool
    rented: bool
    rentals: tuple[Rental, ...] = ()


def run_spend(store: RunRows, run_id: str, *, ledger: Ledger | None = None, now: float | None = None) -> RunSpend:
    """What the run ``run_id`` has cost as of ``now`` (the current time by default).

    Raises:
        UnknownRunError: No such run.
        LedgerError: The ledger file cannot be read (a rented run only).
    """
    now = time.time() if now is None else now
    record = store.get(run_id)
    if compute_of(record) is not None:
        return _rented_spend(record.id, (ledger or Ledger()).rentals(record.id), now)
    return _own_server_spend(record, store.transitions(record.id), now)


def priced_usd(store: RunRows, run_id: str, *, ledger: Ledger | None = None, now: float) -> tuple[float | None, bool]:
    """What the run cost, or None when nothing priced it (an own server without an hourly rate), and whether rented.

    Raises:
        UnknownRunError: No such run.
        LedgerError: The ledger file cannot be read (a rented run only).
    """
    spend = run_spend(store, run_id, ledger=ledger, now=now)
    priced = spend.rented or float(store.get(run_id).spec.get("hourly_rate_usd") or 0.0) > 0
    return (spend.usd if priced else None), spend.rented


def _rented_spend(run_id: str, rentals: Sequence[Rental], now: float) -> RunSpend:
    rentals = [rental for rental in rentals if rental.made]
    running = [rental for rental in rentals if rental.running]
    return RunSpend(
        run_id=run_id,
        usd=sum(rental.usd(now) for rental in rentals),
        rate_per_hour=sum(rental.price_per_hour for rental in running),
        billing=bool(running),
        rented=True,
        rentals=tuple(rentals),
    )


def _own_server_spend(record: RunRow, transitions: list[dict[str, Any]], now: float) -> RunSpend:
    rate = float(record.spec.get("hourly_rate_usd") or 0.0)
    seconds = billable_seconds(transitions, now)
    billing = billing_now(transitions)
    return RunSpend(
        run_id=record.id,
        usd=rate * seconds / 3600 if rate > 0 else 0.0,
        rate_per_hour=rate if billing else 0.0,
        billing=billing and rate > 0,
        rented=False,
    )


# -- stretches of billing and what they add up to ---------------------------------------------------------------------


@dataclass(frozen=True)
class Charge:
    """One stretch of billing at one rate: a rented machine, or the user's own server while a run used it.

    Attributes:
        run_id: The run it was for.
        provider: ``ProviderName.value`` of a rented machine, or :data:`OWN_SERVER`.
        rate_per_hour: Dollars per hour.
        started: When billing started (unix time).
        stopped: When it stopped, or None while it bills.
        instance_id: The provider's id of a rented machine ("" for an own server, or a rental still creating).
        gpu: The rented machine's GPU ("" for an own server).
        state: The rental's state in the ledger ("live" for an own server while it bills, "ended" after).
        end_estimated: The stop is when Rentune saw the machine gone, not a time its provider reported.
        machine_id: The id its provider terminates it by: a cluster's for each of its machines, else ``instance_id``.
    """

    run_id: str
    provider: str
    rate_per_hour: float
    started: float
    stopped: float | None
    instance_id: str = ""
    gpu: str = ""
    state: str = ""
    end_estimated: bool = False
    machine_id: str = ""

    @property
    def billing(self) -> bool:
        """Whether it still bills."""
        return self.stopped is None

    def usd(self, now: float) -> float:
        """Dollars up to ``now`` (up to the stop once stopped)."""
        return self.usd_between(self.started, now, now)

    def usd_between(self, start: float, end: float, now: float) -> float:
        """Dollars inside ``[start, end)``: the part of the stretch within it."""
        stop = self.stopped if self.stopped is not None else now
        return self.rate_per_hour * max(0.0, min(end, stop) - max(start, self.started)) / 3600


def billing_intervals(transitions: Sequence[Mapping[str, Any]]) -> list[tuple[float, float | None]]:
    """The stretches an own server billed, as (start, stop or None while billing).

    The rule is :func:`~desktop.core.runs.progress.billable_seconds`'s: from provisioning or connecting until paused,
    failed or ended.
    """
    intervals: list[tuple[float, float | None]] = []
    since: float | None = None
    for row in transitions:
        state, ts = RunState(row["to_state"]), float(row["ts"])
        if since is None and state in BILLING_STARTS:
            since = ts
        elif since is not None and state in BILLING_ENDS:
            intervals.append((since, max(since, ts)))
            since = None
    if since is not None:
        intervals.append((since, None))
    return intervals


def rental_charge(rental: Rental) -> Charge:
    """A ledger rental as a charge."""
    return Charge(
        rental.run_id,
        rental.provider,
        rental.price_per_hour,
        rental.started,
        rental.stopped,
        rental.instance_id or "",
        rental.gpu,
        rental.state.value,
        rental.end_estimated,
        rental.machine_id or "",
    )


def own_server_charges(record: RunRow, transitions: Sequence[Mapping[str, Any]]) -> list[Charge]:
    """What a run on the user's own server billed at its stated rate (nothing without a rate)."""
    rate = float(record.spec.get("hourly_rate_usd") or 0.0)
    if rate <= 0:
        return []
    return [Charge(record.id, OWN_SERVER, rate, start, stop) for start, stop in billing_intervals(transitions)]


@dataclass(frozen=True)
class PeriodSpend:
    """What was spent in one day or month, per provider.

    Attributes:
        start: The period's first moment (unix time, local midnight).
        end: The moment after it.
        by_provider: Dollars per provider key (only those that spent anything).
    """

    start: float
    end: float
    by_provider: Mapping[str, float] = field(default_factory=dict)

    @property
    def usd(self) -> float:
        """Dollars in all."""
        return sum(self.by_provider.values())


@dataclass(frozen=True)
class RunCost:
    """A run and what it cost.

    Attributes:
        run_id: The run.
        record: Its record, or None when the run was deleted (its rentals stay in the ledger).
        spend: What it cost, as :func:`run_spend` says.
        providers: Where it billed (provider keys, in the order first used).
    """

    run_id: str
    record: RunRow | None
    spend: RunSpend
    providers: tuple[str, ...]


@dataclass(frozen=True)
class SpendOverview:
    """Every dollar spent, as of ``now``: the sums the tray, the status bar and the Costs page show.

    Attributes:
        now: When the sums were taken.
        today_usd: Spent since local midnight.
        month_usd: Spent since the first of this local month.
        total_usd: Spent in all.
        burn_per_hour: Dollars per hour billing now.
        charges: Every stretch of billing, oldest first.
        runs: Every run that cost anything or bills now, newest first.
        by_provider: (provider key, dollars) in all, highest first.
        months: The last months, oldest first (this month last).
        days: The last days, oldest first (today last).
    """

    now: float
    today_usd: float
    month_usd: float
    total_usd: float
    burn_per_hour: float
    charges: tuple[Charge, ...]
    runs: tuple[RunCost, ...]
    by_provider: tuple[tuple[str, float], ...]
    months: tuple[PeriodSpend, ...]
    days: tuple[PeriodSpend, ...]

    @property
    def empty(self) -> bool:
        """Nothing was ever billed."""
        return not self.charges

    @property
    def billing(self) -> tuple[Charge, ...]:
        """The charges still billing."""
        return tuple(charge for charge in self.charges if charge.billing)


def day_starts(now: float, count: int) -> list[float]:
    """The local midnights of the last ``count`` days, oldest first, then the next midnight (``count + 1`` items)."""
    today = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    days = [(today - timedelta(days=back)).date() for back in range(count - 1, -2, -1)]
    return [datetime(day.year, day.month, day.day).timestamp() for day in days]


def month_starts(now: float, count: int) -> list[float]:
    """The local first-of-month midnights of the last ``count`` months, oldest first, then the next month's."""
    moment = datetime.fromtimestamp(now)
    index = moment.year * 12 + moment.month - 1
    return [datetime(i // 12, i % 12 + 1, 1).timestamp() for i in range(index - count + 1, index + 2)]


def _periods(charges: Sequence[Charge], starts: Sequence[float], now: float) -> tuple[PeriodSpend, ...]:
    periods = []
    for start, end in itertools.pairwise(starts):
        by_provider: dict[str, float] = {}
        for charge in charges:
            usd = charge.usd_between(start, end, now)
            if usd > 0:
                by_provider[charge.provider] = by_provider.get(charge.provider, 0.0) + usd
        periods.append(PeriodSpend(start, end, by_provider))
    return tuple(periods)


def _by_provider(charges: Sequence[Charge], now: float) -> tuple[tuple[str, float], ...]:
    sums: dict[str, float] = {}
    for charge in charges:
        sums[charge.provider] = sums.get(charge.provider, 0.0) + charge.usd(now)
    return tuple(sorted(((k, v) for k, v in sums.items() if v > 0), key=lambda item: -item[1]))


def _run_costs(
    records: Sequence[RunRow],
    rentals: Sequence[Rental],
    own: Mapping[str, RunSpend],
    charges: Sequence[Charge],
    now: float,
) -> tuple[RunCost, ...]:
    by_id = {record.id: record for record in records}
    rented: dict[str, list[Rental]] = {}
    for rental in rentals:
        rented.setdefault(rental.run_id, []).append(rental)
    where: dict[str, list[str]] = {}
    for charge in charges:
        seen = where.setdefault(charge.run_id, [])
        if charge.provider not in seen:
            seen.append(charge.provider)
    costs = []
    for run_id in {*rented, *own}:
        record = by_id.get(run_id)
        if run_id in own and record is not None and compute_of(record) is None:
            spend = own[run_id]
        else:
            spend = _rented_spend(run_id, rented.get(run_id, []), now)
        if spend.usd > 0 or spend.billing:
            costs.append(RunCost(run_id, record, spend, tuple(where.get(run_id, ()))))
    costs.sort(key=lambda cost: cost.record.started if cost.record else _first_start(cost.spend), reverse=True)
    return tuple(costs)


def _first_start(spend: RunSpend) -> float:
    return min((rental.started for rental in spend.rentals), default=0.0)


def spend_overview(
    store: RunRows,
    *,
    ledger: Ledger | None = None,
    now: float | None = None,
    months: int = 12,
    days: int = 30,
) -> SpendOverview:
    """Every dollar spent, from the ledger (rented machines) and own-server runs at their rate, as of ``now``.

    Blocking (SQLite reads: the runs, the ledger, and the history of own-server runs that have a rate).

    Raises:
        LedgerError: The ledger file cannot be read.
    """
    now = time.time() if now is None else now
    records = store.all()
    rentals = [rental for rental in (ledger or Ledger()).rentals() if rental.made]
    charges = [rental_charge(rental) for rental in rentals]
    own: dict[str, RunSpend] = {}
    for record in records:
        if compute_of(record) is None and float(record.spec.get("hourly_rate_usd") or 0.0) > 0:
            transitions = store.transitions(record.id)
            own[record.id] = _own_server_spend(record, transitions, now)
            charges += own_server_charges(record, transitions)
    charges.sort(key=lambda charge: charge.started)
    day_bounds, month_bounds = day_starts(now, days), month_starts(now, months)
    return SpendOverview(
        now=now,
        today_usd=sum(charge.usd_between(day_bounds[-2], day_bounds[-1], now) for charge in charges),
        month_usd=sum(charge.usd_between(month_bounds[-2], month_bounds[-1], now) for charge in charges),
        total_usd=sum(charge.usd(now) for charge in charges),
        burn_per_hour=sum(charge.rate_per_hour for charge in charges if charge.billing),
        charges=tuple(charges),
        runs=_run_costs(records, rentals, own, charges, now),
        by_provider=_by_provider(charges, now),
        months=_periods(charges, month_bounds, now),
        days=_periods(charges, day_bounds, now),
    )
