"""A rented run's bill split into what the machine was doing while it billed, and the effective training hour (pure).

Every billed second of every machine the run rented is put in exactly one phase, so the phases add up to the ledger's
dollars. The phase of a moment comes from the run's state history (the transitions the run store records), except
where the trainer's own events say more: while it held at a step boundary for the user's answer the machine was
waiting on the user, and between its first ``export`` event and its ``exported`` event it was exporting; while it
trained and a checkpoint was coming home (the transfers the engine logs), those seconds are checkpoint transfers.

The effective training hour is what each hour of training really cost: all the dollars over the hours of training,
but for serving after training (work the user asked for, not a cost of training).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from desktop.core.runs.states import RunState
from trainer_payload.protocol import EventKind


class BillPhase(StrEnum):
    """What a billing machine was doing, in the order a run goes through them."""

    WAITING_FOR_MACHINE = "waiting for the machine"
    SETUP = "setup and upload"
    TRAINING = "training"
    CHECKPOINT_TRANSFER = "checkpoint transfers while training"
    WAITING_ON_YOU = "waiting on you"
    PULLING_HOME = "pulling home"
    EXPORT = "export on the machine"
    SERVING = "serving the tuned model"
    TEARDOWN = "teardown"


#: The phase of each run state (a state not named here bills as teardown: the run has left the machine).
_PHASE_OF_STATE = {
    RunState.PLANNED: BillPhase.WAITING_FOR_MACHINE,
    RunState.PROVISIONING: BillPhase.WAITING_FOR_MACHINE,
    RunState.CONNECTING: BillPhase.SETUP,
    RunState.UPLOADING: BillPhase.SETUP,
    RunState.BOOTSTRAPPING: BillPhase.SETUP,
    RunState.TRAINING: BillPhase.TRAINING,
    RunState.SYNCING: BillPhase.PULLING_HOME,
    RunState.PULLING: BillPhase.PULLING_HOME,
    RunState.SERVING: BillPhase.SERVING,
}
#: Phases in which the GPUs trained (while a checkpoint came home they went on training).
TRAINING_PHASES = frozenset({BillPhase.TRAINING, BillPhase.CHECKPOINT_TRANSFER})
#: Phases in which the GPU did no training although it was paid for (serving is work the user asked for).
IDLE_PHASES = frozenset(set(BillPhase) - TRAINING_PHASES - {BillPhase.SERVING})


@dataclass(frozen=True)
class BilledStretch:
    """One machine's billing: from ``start`` to ``end`` (epoch seconds) at ``price_per_hour`` dollars."""

    start: float
    end: float
    price_per_hour: float


@dataclass(frozen=True)
class PhaseCost:
    """What one phase cost: machine-seconds billed in it (summed over machines) and their dollars."""

    phase: BillPhase
    seconds: float
    usd: float


@dataclass(frozen=True)
class BillSplit:
    """A run's bill by phase.

    Attributes:
        phases: Every phase, in :class:`BillPhase` order (zero where the run never was in it).
        usd: All the dollars (the sum of the phases, the ledger's dollars for the run).
        training_hours: Hours the run trained while a machine billed (wall time, not machine-hours).
    """

    phases: tuple[PhaseCost, ...]
    usd: float
    training_hours: float

    @property
    def idle_usd(self) -> float:
        """Dollars paid while no machine trained."""
        return sum(cost.usd for cost in self.phases if cost.phase in IDLE_PHASES)

    @property
    def effective_usd_per_training_hour(self) -> float | None:
        """What an hour of training really cost: its dollars (all but serving after it) over its hours (None before)."""
        serving = sum(cost.usd for cost in self.phases if cost.phase is BillPhase.SERVING)
        return (self.usd - serving) / self.training_hours if self.training_hours > 0 else None

    def as_dict(self) -> dict[str, Any]:
        """The split as the CLI's JSON gives it (dollars unrounded)."""
        return {
            "usd": self.usd,
            "idle_usd": self.idle_usd,
            "training_hours": self.training_hours,
            "usd_per_training_hour": self.effective_usd_per_training_hour,
            "phases": [{"phase": c.phase.value, "seconds": c.seconds, "usd": c.usd} for c in self.phases],
        }


@dataclass(frozen=True)
class _Override:
    start: float
    end: float
    phase: BillPhase


def split_bill(
    stretches: Sequence[BilledStretch],
    transitions: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    transfers: Sequence[tuple[float, float]] = (),
) -> BillSplit:
    """Splits the billing ``stretches`` of a run's machines by what the run was doing (see the module's words).

    ``transfers``: when checkpoints were being brought home (start, end); while the run trained, those seconds are
    checkpoint transfers while training (the GPUs trained on meanwhile: not idle).
    """
    timeline = _Timeline([(float(row["ts"]), RunState(str(row["to_state"]))) for row in transitions])
    timeline.overrides = [*_holds(events), *_export(events)]
    timeline.transfers = [(float(a), float(b)) for a, b in transfers if b > a]
    seconds = dict.fromkeys(BillPhase, 0.0)
    usd = dict.fromkeys(BillPhase, 0.0)
    for stretch in stretches:
        for start, end, phase in timeline.pieces(stretch.start, stretch.end):
            seconds[phase] += end - start
            usd[phase] += stretch.price_per_hour * (end - start) / 3600
    training = sum(  # wall time: machines of one cluster train at once
        end - start
        for span in _merged((s.start, s.end) for s in stretches)
        for start, end, phase in timeline.pieces(*span)
        if phase in TRAINING_PHASES
    )
    phases = tuple(PhaseCost(phase, seconds[phase], usd[phase]) for phase in BillPhase)
    return BillSplit(phases, sum(usd.values()), training / 3600)


@dataclass
class _Timeline:
    """The run's states over time, and the stretches the trainer's events say more about."""

    states: list[tuple[float, RunState]]
    overrides: list[_Override] = field(default_factory=list)
    transfers: list[tuple[float, float]] = field(default_factory=list)

    def pieces(self, start: float, end: float) -> Iterator[tuple[float, float, BillPhase]]:
        """``[start, end)`` cut wherever the phase may change, each piece with its phase."""
        moments = {ts for ts, _ in self.states} | {o.start for o in self.overrides} | {o.end for o in self.overrides}
        moments |= {ts for span in self.transfers for ts in span}
        cuts = [start, *sorted(m for m in moments if start < m < end), end] if end > start else []
        for a, b in itertools.pairwise(cuts):
            yield a, b, self.phase_at((a + b) / 2)

    def phase_at(self, moment: float) -> BillPhase:
        """The phase at ``moment``: a hold or the export where one covers it, else the run's state's.

        Training while a checkpoint came home is a checkpoint transfer.
        """
        for override in self.overrides:
            if override.start <= moment < override.end:
                return override.phase
        current = None
        for ts, state in self.states:
            if ts > moment:
                break
            current = state
        if current is None:
            return BillPhase.WAITING_FOR_MACHINE
        phase = _PHASE_OF_STATE.get(current, BillPhase.TEARDOWN)
        if phase is BillPhase.TRAINING and any(start <= moment < end for start, end in self.transfers):
            return BillPhase.CHECKPOINT_TRANSFER
        return phase


def _merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping spans joined (machines of one cluster bill at once; their training is one wall time)."""
    joined: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], end))
        else:
            joined.append((start, end))
    return joined


def _holds(events: Sequence[Mapping[str, Any]]) -> list[_Override]:
    """The stretches the trainer held at a step boundary waiting for the user's answer."""
    found, began = [], None
    for event in events:
        if event.get("event") != EventKind.HOLD or not isinstance(event.get("ts"), int | float):
            continue
        if event.get("held") is True:
            began = float(event["ts"])
        elif began is not None:
            found.append(_Override(began, float(event["ts"]), BillPhase.WAITING_ON_YOU))
            began = None
    return found


def _export(events: Sequence[Mapping[str, Any]]) -> list[_Override]:
    """The stretch from the machine's first export event to its ``exported`` event (none when it never ended)."""
    times = {
        kind: [float(e["ts"]) for e in events if e.get("event") == kind and isinstance(e.get("ts"), int | float)]
        for kind in (EventKind.EXPORT, EventKind.EXPORTED)
    }
    if not times[EventKind.EXPORT] or not times[EventKind.EXPORTED]:
        return []
    start = min(times[EventKind.EXPORT])
    ends = [ts for ts in times[EventKind.EXPORTED] if ts >= start]
    return [_Override(start, max(ends), BillPhase.EXPORT)] if ends else []
