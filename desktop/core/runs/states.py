"""The states of a run and the transitions allowed between them."""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """Where a run is. Persisted before every transition, so a restarted app finds every run where it was."""

    PLANNED = "planned"
    PROVISIONING = "provisioning"
    CONNECTING = "connecting"
    UPLOADING = "uploading"
    BOOTSTRAPPING = "bootstrapping"
    TRAINING = "training"
    SYNCING = "syncing"
    PULLING = "pulling"
    SERVING = "serving"  # [serve]: the adapter is home; the machine serves the tuned model until idle or stopped
    FINISHED = "finished"
    PAUSED = "paused"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({RunState.FINISHED, RunState.CANCELLED})
# Runs in these states can be continued with `rentune resume`.
RESUMABLE = frozenset(set(RunState) - TERMINAL)
#: Ended runs the user may take up again: a stopped run continues from its newest checkpoint. Only an explicit
#: resume reopens one (:func:`check_transition` with ``reopen``); nothing the engine does on its own can.
REOPENABLE = frozenset({RunState.CANCELLED})

FLOW = [
    RunState.PLANNED,
    RunState.PROVISIONING,
    RunState.CONNECTING,
    RunState.UPLOADING,
    RunState.BOOTSTRAPPING,
    RunState.TRAINING,
    RunState.SYNCING,
    RunState.PULLING,
    RunState.SERVING,
    RunState.FINISHED,
]
#: States in which the trainer may be working (or about to): the app follows these runs, reattaching at start.
LIVE = frozenset(FLOW) - TERMINAL


def flow_through(last: RunState) -> frozenset[RunState]:
    """The states of the normal flow up to and including ``last``."""
    return frozenset(FLOW[: FLOW.index(last) + 1])


class TransitionError(ValueError):
    """A transition the state machine does not allow."""


def check_transition(current: RunState, target: RunState, *, reopen: bool = False) -> None:
    """Allows any step forward in the flow, pausing/failing/cancelling from any live state, and resuming.

    Args:
        current: The run's state now.
        target: The state it is to move to.
        reopen: The user resumes an ended run: a :data:`REOPENABLE` one may become paused (and is then driven on).

    Raises:
        TransitionError: ``current`` is terminal (and not being reopened).
    """
    if reopen and current in REOPENABLE and target is RunState.PAUSED:
        return
    if current in TERMINAL and target is not current:
        raise TransitionError(f"run is {current.value}; it cannot become {target.value}")
