"""A rented run's bill by phase (:mod:`desktop.core.runs.bill_phases`).

Read from the ledger, the run's history and the trainer's events as mirrored on this computer.
"""

from __future__ import annotations

import time

from desktop.core.runs.bill_phases import BilledStretch, BillSplit, split_bill
from desktop.services.billing.ledger import Ledger
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore


def run_bill_split(
    store: RunStore, run_id: str, *, ledger: Ledger | None = None, now: float | None = None
) -> BillSplit | None:
    """The bill of run ``run_id`` (id or unique prefix) by phase as of ``now``; None when it rented no machine.

    Raises:
        UnknownRunError: No run (or several) match ``run_id``.
    """
    record = store.get(run_id)
    moment = time.time() if now is None else now
    rentals = [rental for rental in (ledger or Ledger()).rentals(record.id) if rental.made]
    if not rentals:
        return None
    stretches = [BilledStretch(r.started, r.end(moment), r.price_per_hour) for r in rentals]
    return split_bill(stretches, store.transitions(record.id), mirrored_events(store.folder(record.id)))
