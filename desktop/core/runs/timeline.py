"""A run's history as the monitor draws it: the phases it went through, those still to come, and its machines (pure).

:func:`run_timeline` joins the phases of :func:`~desktop.core.runs.progress.phase_durations` with the phases still
ahead and with a mark where each machine the run used begins (a spot machine taken away and replaced shows as a
second machine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from desktop.core.runs.progress import ENDED, PhaseSpan, phase_durations
from desktop.core.runs.states import FLOW, RunState

#: States a run passes through on its own that the timeline announces ahead (renting happens while planned; serving
#: only when the spec asks for it, and it shows once reached).
_AHEAD = [state for state in FLOW if state not in {RunState.PLANNED, RunState.PROVISIONING, RunState.SERVING}]


@dataclass(frozen=True)
class MachineMark:
    """A machine the run trained on, placed in the timeline where it begins.

    Attributes:
        number: 1 for the run's first machine, 2 for the one that replaced it, and so on.
        provider: The provider's name (``runpod``), or "" for the user's own server.
        gpu: The machine's GPU as the provider names it.
        price_per_hour: What it costs per hour.
        started: When it was rented (epoch seconds).
        stopped: When it was let go (None while it runs).
        why_stopped: Why it was let go, in the engine's words ("" when not known or still running).
    """

    number: int
    provider: str
    gpu: str
    price_per_hour: float
    started: float
    stopped: float | None
    why_stopped: str = ""


TimelineItem = PhaseSpan | MachineMark


def upcoming_states(transitions: Sequence[Mapping[str, object]]) -> list[RunState]:
    """The phases a live run will still go through on its way to finished (none once it ended).

    A paused run reconnects first, then goes through again the phase it was paused in (from uploading on).
    """
    if not transitions:
        return list(_AHEAD)
    states = [RunState(str(row["to_state"])) for row in transitions]
    last = states[-1]
    if last in ENDED:
        return []
    reached = max((FLOW.index(state) for state in states if state in FLOW), default=0)
    if last is RunState.PAUSED:
        again = max(reached, FLOW.index(RunState.UPLOADING))
        return [RunState.CONNECTING, *(state for state in FLOW[again:] if state in _AHEAD)]
    return [state for state in FLOW[FLOW.index(last) + 1 :] if state in _AHEAD]


def run_timeline(
    transitions: Sequence[Mapping[str, object]], now: float, machines: Sequence[MachineMark] = ()
) -> list[TimelineItem]:
    """The run's phases in order, each machine's mark before the first phase on it, then the phases to come."""
    spans = phase_durations(transitions, now)
    items: list[TimelineItem] = []
    pending = sorted(machines, key=lambda mark: mark.started)
    for span in spans:
        while pending and pending[0].started <= span.started:
            items.append(pending.pop(0))
        items.append(span)
    items.extend(pending)
    items.extend(PhaseSpan(state, now, 0.0, current=False, upcoming=True) for state in upcoming_states(transitions))
    return items
