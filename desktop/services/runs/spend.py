"""What a run has cost so far: the one answer every page, the tray and the CLI give.

A rented run's dollars come from the ledger (price times time of each machine it rented, the count the budget stop
uses); a run on the user's own server is metered at the hourly rate they stated, over the time it billed (from
reaching the machine until it ended or paused). Asking twice at the same ``now`` gives the same cents everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from desktop.core.runs.progress import billable_seconds, billing_now
from desktop.services.billing.ledger import Ledger, Rental
from desktop.services.runs.rental import compute_of
from desktop.services.runs.store import RunRecord, RunStore


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


def run_spend(store: RunStore, run_id: str, *, ledger: Ledger | None = None, now: float | None = None) -> RunSpend:
    """What the run ``run_id`` has cost as of ``now`` (the current time by default).

    Raises:
        UnknownRunError: No such run.
        LedgerError: The ledger file cannot be read (a rented run only).
    """
    now = time.time() if now is None else now
    record = store.get(run_id)
    if compute_of(record) is not None:
        return _rented_spend(record, (ledger or Ledger()).rentals(run_id), now)
    return _own_server_spend(record, store.transitions(run_id), now)


def _rented_spend(record: RunRecord, rentals: list[Rental], now: float) -> RunSpend:
    running = [rental for rental in rentals if rental.running]
    return RunSpend(
        run_id=record.id,
        usd=sum(rental.usd(now) for rental in rentals),
        rate_per_hour=sum(rental.price_per_hour for rental in running),
        billing=bool(running),
        rented=True,
        rentals=tuple(rentals),
    )


def _own_server_spend(record: RunRecord, transitions: list[dict[str, Any]], now: float) -> RunSpend:
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
