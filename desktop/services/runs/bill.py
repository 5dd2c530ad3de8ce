"""A rented run's bill by phase (:mod:`desktop.core.runs.bill_phases`).

Read from the ledger, the run's history and the trainer's events as mirrored on this computer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.runs.bill_phases import BilledStretch, BillSplit, split_bill
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.spend import month_starts
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from desktop.services.runs.transfer_log import read_transfers
from trainer_payload.protocol import EVENTS_FILE_NAME, EventKind, read_event_file


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
    folder = store.folder(record.id)
    return split_bill(stretches, store.transitions(record.id), mirrored_events(folder), read_transfers(folder))


@dataclass(frozen=True)
class MonthIdle:
    """What the rented machines billed this local month, and how much of it while nothing trained."""

    usd: float
    idle_usd: float


class BillEvents:
    """The hold and export events of each run's mirrored events, read on from where the last read ended.

    The Costs page asks every few seconds; a long run's events file is megabytes of steps, read once.
    """

    KINDS = frozenset({EventKind.HOLD, EventKind.EXPORT, EventKind.EXPORTED})

    def __init__(self) -> None:
        self._read: dict[Path, tuple[int, list[dict[str, Any]]]] = {}

    def of(self, folder: Path) -> list[dict[str, Any]]:
        """The run's hold and export events so far (blocking: reads what was added to its events file)."""
        path = folder / EVENTS_FILE_NAME
        offset, kept = self._read.get(path, (0, []))
        tail = read_event_file(path, offset)  # a replaced file is read from its start; a torn last line waits
        kept = [] if tail.restarted else kept
        kept = [*kept, *(dict(event) for event in tail.events if event["event"] in self.KINDS)]
        self._read[path] = (tail.offset, kept)
        return list(kept)


def month_idle(
    store: RunStore, events: BillEvents, *, ledger: Ledger | None = None, now: float | None = None
) -> MonthIdle:
    """The rented machines' dollars of this local month, and those billed while nothing trained (blocking)."""
    moment = time.time() if now is None else now
    start, end = month_starts(moment, 1)[-2:]
    by_run: dict[str, list[BilledStretch]] = {}
    for rental in (ledger or Ledger()).rentals():
        stretch = BilledStretch(max(rental.started, start), min(rental.end(moment), end), rental.price_per_hour)
        if rental.made and stretch.end > stretch.start:
            by_run.setdefault(rental.run_id, []).append(stretch)
    usd = idle = 0.0
    for run_id, stretches in by_run.items():  # a deleted run has no history: its dollars count as waiting
        split = split_bill(stretches, store.transitions(run_id), events.of(store.runs_dir / run_id))
        usd, idle = usd + split.usd, idle + split.idle_usd
    return MonthIdle(usd, idle)
