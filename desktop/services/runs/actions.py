"""What the user may do with a run now, and why not: one answer for the monitor, the runs list and the engine."""

from __future__ import annotations

from desktop.core.runs.states import LIVE, RunState
from desktop.services.runs.store import RunRecord


def resume_refusal(record: RunRecord) -> str | None:
    """Why the run cannot be resumed now, as the end of a sentence ("it finished ..."); None when it can.

    Paused, failed and stopped runs continue from their newest checkpoint; a run stopped at its budget would stop
    again at once, and a finished one has nothing left to train.
    """
    if record.state is RunState.FINISHED:
        return "it finished: its adapter is on this computer"
    if record.state in LIVE:
        return f"it is still {record.state.value}"
    if record.state is RunState.CANCELLED and record.spec.get("budget_stop"):
        return f"it was stopped at its budget ({record.spec['budget_stop']}), so it would stop again at once"
    return None


def was_stopped_by_user(record: RunRecord) -> bool:
    """Whether the run ended because the user asked it to stop (not its budget, not a failure)."""
    return record.state is RunState.CANCELLED and not record.spec.get("budget_stop")
