"""The soak's invariants. What bills is read only from the fakes (their book of instances); the run store says only
whether a machine's run (named by its label at the fake) is still live.

1. At every check, each machine billing at a fake belongs to a run of this schedule that is still live, or that ended
   less than :data:`ENDED_RUN_GRACE_S` ago; after the final settle nothing bills at any fake.
2. Each machine's dollars in the ledger equal the fake's billed seconds times its price, within 1 %.
3. No adapter that reached home is lost (and, checked by the machine room, no machine is taken away by Rentune while a
   transfer to or from it moves).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from desktop.core.runs.labels import parse_label
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger, Rental
from desktop.services.providers.base import ProviderName
from desktop.services.runs.context import ENDED
from desktop.services.runs.store import RunStore, UnknownRunError
from tests.fakes.http import FakeCloud, FakeInstance
from tests.soak.faults import SLOW_ANSWER_MAX_S, SLOW_ANSWERS
from tests.soak.processes import SETTLE_EVERY_S, TERMINATE_PATIENCE_S

#: Seconds a machine may go on billing after its run ended, in normal operation. The driver terminates it at once,
#: but a provider may answer slowly (every slow answer queued, met in a row) and refuse terminates until the patience
#: runs out; the rental is then ``terminating`` and the next settle (the background one, or the next start's after a
#: kill) tries again with the same patience. Beyond that, on a loaded computer, a second of slack.
ENDED_RUN_GRACE_S = SLOW_ANSWERS * SLOW_ANSWER_MAX_S + 2 * TERMINATE_PATIENCE_S + SETTLE_EVERY_S + 1.0
#: Seconds the app's and the fake's clock readings around one call may differ (both read time.time()).
CLOCK_SKEW_S = 0.05
#: Seconds Rentune may take to notice a machine its provider took away without saying when (polls, slow answers).
NOTICE_S = 6.0
#: Seconds an end Rentune estimated (the provider reports none) may be off from the provider's: one terminate's
#: round trip, the answer included, on an event loop shared by four runs on a loaded computer. A soak rental lasts
#: seconds, so 1 % of it is less than that; over a real rental of ten minutes it is under 0.05 %.
ROUND_TRIP_S = 0.25
#: Seconds an end Rentune estimated after its own terminate may be late: the ledger writes it once the answer reached
#: the app, and on a loaded computer (the full suite beside four runs on one loop) that took 0.3-0.7 s in one clean-
#: clone run of five. Late means booked a little more, never less; over a ten-minute rental 2 s is 0.3 %.
LATE_RECORD_S = 2.0


def billing(cloud: FakeCloud) -> list[tuple[str, str]]:
    """The machines that bill at a fake now (stopped ones too: their disk bills), as (id, label)."""
    with cloud.lock:
        return [(instance.id, instance.label) for instance in cloud.live_instances()]


class BillingWatch:
    """Invariant 1, checked as often as the schedule asks and once more after the final settle.

    Args:
        clouds: The fakes.
        installation: This installation's id (its machines' labels carry it).
        run_ids: The schedule's runs.
    """

    def __init__(self, clouds: dict[ProviderName, FakeCloud], installation: str, run_ids: Iterable[str]) -> None:
        self.clouds, self.installation, self.run_ids = clouds, installation, set(run_ids)
        self.breaks: list[str] = []
        self.checks = 0
        self._store = RunStore()
        self._flagged: set[tuple[ProviderName, str]] = set()

    def check(self) -> None:
        """Each billing machine belongs to a live run (or one that ended less than the grace ago)."""
        self.checks += 1
        now = time.time()
        for name, cloud in self.clouds.items():
            for instance_id, label in billing(cloud):
                why = self._why_it_may_not_bill(label, now)
                if why is not None and (name, instance_id) not in self._flagged:
                    self._flagged.add((name, instance_id))
                    self.breaks.append(f"{name.value} {instance_id} bills {why}")

    def after_final_settle(self) -> None:
        """Nothing bills at any fake."""
        for name, cloud in self.clouds.items():
            for instance_id, label in billing(cloud):
                owner = parse_label(label)
                state = self._state(owner.run_id) if owner else None
                run = f"run {owner.run_id} {state.value if state else 'unknown'}" if owner else f"label {label!r}"
                self.breaks.append(f"{name.value} {instance_id} still bills after the final settle ({run})")

    def _why_it_may_not_bill(self, label: str, now: float) -> str | None:
        """None when the machine may bill now, else why not."""
        owner = parse_label(label)
        if owner is None or not owner.belongs_to(self.installation) or owner.run_id not in self.run_ids:
            return f"under a name no run of this schedule has ({label!r})"
        state = self._state(owner.run_id)
        if state is None or state not in ENDED:
            return None
        late = now - self._ended_at(owner.run_id)
        return None if late <= ENDED_RUN_GRACE_S else f"{late:.1f} s after its run {owner.run_id} was {state.value}"

    def _state(self, run_id: str) -> RunState | None:
        try:
            return self._store.get(run_id).state
        except UnknownRunError:
            return None

    def _ended_at(self, run_id: str) -> float:
        """When the run last moved into an ended state."""
        ends = [row["ts"] for row in self._store.transitions(run_id) if RunState(row["to_state"]) in ENDED]
        return float(ends[-1]) if ends else time.time()


@dataclass
class Dollars:
    """Invariant 2's findings.

    Attributes:
        breaks: One line per machine whose booked dollars differ from its billed ones.
        gaps: Per machine, booked minus billed seconds, and how its end was known: "reported" by the provider,
            "estimated" (when the terminate was accepted), or "noticed" (a machine taken away, seen gone).
        estimated_ends: Machines the provider took away without an end time (checked for lateness).
        unknowable: Machines never booked that no client could know of (see :func:`unknowable`).
    """

    breaks: list[str] = field(default_factory=list)
    gaps: list[tuple[float, str]] = field(default_factory=list)
    estimated_ends: int = 0
    unknowable: list[str] = field(default_factory=list)


def check_dollars(clouds: dict[ProviderName, FakeCloud], ledger: Ledger) -> Dollars:
    """Every machine a fake ever made, booked in the ledger at the dollars the fake bills for it."""
    found = Dollars()
    for name, cloud in clouds.items():
        with cloud.lock:
            instances = list(cloud.instances.values())
        for instance in instances:
            row = ledger.get(name.value, instance.id)
            if row is None and unknowable(instance):
                found.unknowable.append(f"{name.value} {instance.id}")
            elif row is None:
                billed = cloud.billed_seconds(instance.id) * instance.price_per_hour / 3600
                found.breaks.append(f"{name.value} {instance.id} billed ${billed:.6f} and was never booked")
            else:
                _check_machine(cloud, instance, row, found)
    return found


def unknowable(instance: FakeInstance) -> bool:
    """A machine no client could know of: the provider destroyed it on its own (its host lost) before any answer
    that reached a client named it, as after a create whose answer was lost (a provider forgets a destroyed machine:
    RunPod answers 404). It billed seconds nobody can book; the soak counts them apart."""
    return bool(instance.extra.get("lost")) and not instance.extra.get("revealed")


def _check_machine(cloud: FakeCloud, instance: FakeInstance, row: Rental, found: Dollars) -> None:
    """Booked dollars against billed ones: within 1 %, except where the provider took the machine away and reported
    no end time: then the ledger's estimated end (when Rentune saw it gone) may be later, never earlier, by at most
    the time it takes to notice (a few polls, slow answers included)."""
    price = instance.price_per_hour  # the fake's price: a row booked at another price must not pass
    billed = cloud.billed_seconds(instance.id) * price / 3600
    booked = row.usd(time.time())
    skew = (ROUND_TRIP_S if row.end_estimated else CLOCK_SKEW_S) * price / 3600
    taken = instance.stopped is not None or "lost" in instance.extra or "preempted" in instance.extra
    kind = "noticed" if taken and row.end_estimated else "estimated" if row.end_estimated else "reported"
    found.gaps.append(((booked - billed) * 3600 / price if price else 0.0, kind))
    if taken and row.end_estimated:
        found.estimated_ends += 1
        if -skew <= booked - billed <= NOTICE_S * price / 3600:
            return
    # 1 %, or the few milliseconds between the fake's clock reading and the app's around one in-process call (a
    # rental killed right after its create lasts a fraction of a second here, hours in life), or for an end the
    # provider did not report, one terminate's round trip.
    elif abs(booked - billed) <= max(0.01 * billed, skew):
        return
    elif row.end_estimated and -skew <= booked - billed <= LATE_RECORD_S * price / 3600:
        return  # recorded after the terminate's answer arrived on a busy loop: booked late, never short
    found.breaks.append(
        f"{row.provider} {row.instance_id} booked ${booked:.6f}, billed ${billed:.6f}"
        + (" (end estimated)" if row.end_estimated else "")
    )


def lost_adapters(run_ids: Iterable[str]) -> list[str]:
    """Invariant 3: each run that finished has its adapter at home."""
    store = RunStore()
    lost = []
    for run_id in run_ids:
        record = store.get(run_id)
        adapter = Path(record.adapter or "") / "adapter_model.safetensors"
        if record.state is RunState.FINISHED and not adapter.is_file():
            lost.append(f"run {run_id} finished but its adapter is gone")
    return lost
