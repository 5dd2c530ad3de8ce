"""What bills right now and how to stop it: the reading behind the tray menu, the status-bar meter and the Costs page.

A :class:`MeterReading` joins the spend (:func:`~desktop.services.billing.spend.spend_overview`) with the machines that
bill now: each live run's rented machine or own server (Stop ends the run through the run manager), and machines no
live run uses (orphans found at the providers, or rentals the ledger still counts for an ended run): those are
terminated at the provider with :func:`terminate_machine`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from desktop.core.runs.progress import ENDED
from desktop.core.runs.states import LIVE
from desktop.services.billing.activity import last_activity
from desktop.services.billing.ledger import Ledger, cluster_words
from desktop.services.billing.records import RunRow, RunRows
from desktop.services.billing.rentals import rental_of
from desktop.services.billing.spend import OWN_SERVER, Charge, SpendOverview, spend_overview
from desktop.services.providers.base import BILLING, Instance
from trainer_payload.protocol import EVENTS_FILE_NAME


@dataclass(frozen=True)
class BillingMachine:
    """A machine that bills now.

    Attributes:
        provider: ``ProviderName.value``, or :data:`~desktop.services.billing.spend.OWN_SERVER` for the user's server.
        instance_id: The provider's id ("" for an own server).
        gpu: The rented GPU, or the own server's address.
        rate_per_hour: Dollars per hour.
        usd: What it cost so far (0 when the ledger does not know the machine).
        run_id: The run it was rented for (None for a machine of unknown origin).
        owned: A live run uses it: stopping it means stopping that run.
        machines: How many machines it is: more than one for a cluster, rented and stopped as one.
    """

    provider: str
    instance_id: str
    gpu: str
    rate_per_hour: float
    usd: float
    run_id: str | None
    owned: bool
    machines: int = 1

    @property
    def key(self) -> str:
        """A stable name for the machine (menus and lists keep their rows by it)."""
        return f"{self.provider}:{self.instance_id or self.run_id}"

    @property
    def rented(self) -> bool:
        """Rented from a provider (not the user's own server)."""
        return self.provider != OWN_SERVER


@dataclass(frozen=True)
class MeterReading:
    """What is spent and what bills, as of ``overview.now``.

    Attributes:
        overview: Every dollar spent.
        machines: The machines billing now, the ones live runs use first.
        records: Every run.
        live: The runs that go on without the app (training continues detached on their machines).
        last_progress: When each live run last moved (unix time), for the idle notice.
    """

    overview: SpendOverview
    machines: tuple[BillingMachine, ...]
    records: tuple[RunRow, ...]
    live: tuple[RunRow, ...]
    last_progress: dict[str, float]

    @property
    def now(self) -> float:
        """When the reading was taken."""
        return self.overview.now

    @property
    def burn_per_hour(self) -> float:
        """Dollars per hour every billing machine costs now (orphans included)."""
        return sum(machine.rate_per_hour for machine in self.machines)

    @property
    def busy(self) -> bool:
        """Something runs or bills: closing the app leaves it going."""
        return bool(self.live or self.machines)


def _charge_machine(charges: list[Charge], records: dict[str, RunRow], live: set[str], now: float) -> BillingMachine:
    """One machine from its open charges: a single machine's one, or every machine's of a cluster (stopped as one)."""
    charge = charges[0]
    record = records.get(charge.run_id)
    rate, usd = sum(c.rate_per_hour for c in charges), sum(c.usd(now) for c in charges)
    if charge.provider == OWN_SERVER:
        where = (record.target if record else None) or "your server"
        return BillingMachine(OWN_SERVER, "", where, rate, usd, charge.run_id, True)
    machine_id = charge.machine_id or charge.instance_id
    rental = rental_of(record) if record is not None else None
    # As the orphan check counts it: a live run owns the machine it rents now (any, while it records none yet).
    owned = charge.run_id in live and (rental is None or rental.instance_id == machine_id)
    gpu = charge.gpu if len(charges) == 1 else cluster_words(charge.gpu, len(charges))
    return BillingMachine(charge.provider, machine_id, gpu, rate, usd, charge.run_id, owned, len(charges))


def _orphan_machine(instance: Instance) -> BillingMachine:
    name = instance.name
    run_id = name.removeprefix("rentune-") if name.startswith("rentune-") else None
    gpu = instance.gpu or name
    return BillingMachine(
        instance.provider.value, instance.instance_id, gpu, instance.price_per_hour, 0.0, run_id, False
    )


def billing_machines(
    overview: SpendOverview, records: Sequence[RunRow], orphans: Sequence[Instance] = ()
) -> tuple[BillingMachine, ...]:
    """The machines billing now: from the charges still open, then orphans the ledger does not count."""
    by_id = {record.id: record for record in records}
    live = set(live_runs_of(records))
    groups: dict[tuple[str, str], list[Charge]] = {}
    for charge in overview.billing:  # a cluster's machines are one to stop (an own server's stretch has no id)
        groups.setdefault((charge.provider, charge.machine_id or charge.instance_id or charge.run_id), []).append(
            charge
        )
    machines = [_charge_machine(charges, by_id, live, overview.now) for charges in groups.values()]
    known = {(machine.provider, machine.instance_id) for machine in machines}
    for instance in orphans:
        if instance.state in BILLING and (instance.provider.value, instance.instance_id) not in known:
            machines.append(_orphan_machine(instance))
            known.add((instance.provider.value, instance.instance_id))
    machines.sort(key=lambda machine: (not machine.owned, machine.provider, machine.instance_id))
    return tuple(machines)


def live_runs_of(records: Sequence[RunRow]) -> list[str]:
    """The runs that may still use a machine (not ended, not failed), as the orphan check counts them."""
    return [record.id for record in records if record.state not in ENDED]


def last_event_time(folder: Path) -> float | None:
    """When this computer last mirrored a new event of the run (the mirror's change time; None when there is none).

    This computer's clock, not the event's ``ts``: a machine's clock, or a ``ts`` it made up, never decides whether
    the run is idle.
    """
    try:
        moment = (folder / EVENTS_FILE_NAME).stat().st_mtime
    except OSError:
        return None
    return moment if math.isfinite(moment) else None


def last_progress(record: RunRow, transitions: Sequence[dict[str, object]], folder: Path) -> float:
    """When a run last moved, counted as the rental driver's idle guard does.

    A new trainer event, a state change, its machine coming up, or bytes of a transfer moving (an upload, a model
    download, a checkpoint or adapter pull) count as moving.
    """
    times = [record.started]
    rental = rental_of(record)
    if rental is not None:
        times.append(rental.ready or rental.created)
    times += [float(str(row["ts"])) for row in transitions]
    times += [t for t in (last_event_time(folder), last_activity(folder)) if t is not None]
    return max(t for t in times if math.isfinite(t))


def read_meter(
    store: RunRows,
    ledger: Ledger | None = None,
    orphans: Sequence[Instance] = (),
    now: float | None = None,
) -> MeterReading:
    """Reads what is spent and what bills now (blocking: short SQLite reads and the end of live runs' event files).

    Args:
        store: The runs.
        ledger: The ledger (the app's by default).
        orphans: Machines found at the providers that no live run owns (from the check at start).
        now: The moment to read at (the current time by default).

    Raises:
        LedgerError: The ledger file cannot be read.
    """
    now = time.time() if now is None else now
    overview = spend_overview(store, ledger=ledger, now=now)
    records = store.all()
    live = tuple(record for record in records if record.state in LIVE)
    progress = {
        record.id: last_progress(record, store.transitions(record.id), store.runs_dir / record.id) for record in live
    }
    machines = billing_machines(overview, records, orphans)
    return MeterReading(overview, machines, tuple(records), live, progress)
