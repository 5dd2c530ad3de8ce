"""The budget in every phase of a rented run, from the create request to the machine's end.

The trainer is asked to save and stop gracefully by the engine's monitor once the budget, less what stopping costs,
is spent. Before the trainer runs (waiting for the machine, the upload, the bootstrap, the model download) nothing
would save anyway, so there the machine is let go at once, as it is while serving after training (the adapter is
home). A trainer that overruns the whole budget is stopped hard,
except while the final adapter (or the last checkpoint) is being pulled home: that pull is never interrupted.
"""

from __future__ import annotations

from desktop.core.runs.states import RunState
from desktop.services.billing.records import RunRow

#: The trainer works and saves on a graceful stop (the engine's monitor asks it to).
TRAINER_STATES = frozenset({RunState.TRAINING})
#: The final pull: never interrupted by the budget.
PULL_STATES = frozenset({RunState.SYNCING, RunState.PULLING})


def budget_of(record: RunRow) -> float:
    """The run's ``max_usd`` (0: none)."""
    return float(record.spec.get("budget_usd") or 0.0)


def budget_breach(record: RunRow, spent: float, spent_with_stop: float) -> str | None:
    """Why the machine must be let go now for the budget, or None.

    Args:
        record: The run.
        spent: Dollars its rentals cost so far.
        spent_with_stop: What it will have cost once a stop that starts now is done.
    """
    budget = budget_of(record)
    if budget <= 0 or record.state in PULL_STATES:
        return None
    if record.state in TRAINER_STATES:
        if spent < budget:
            return None  # the monitor's graceful stop has the time it needs
        return f"the budget of ${budget:,.2f} was reached (${spent:,.2f}) and the trainer had not stopped"
    if spent_with_stop < budget:
        return None
    if record.state is RunState.SERVING:
        return (
            f"the budget of ${budget:,.2f} would be crossed while serving (${spent:,.2f} spent, "
            f"${spent_with_stop:,.2f} with stopping the machine); raise [budget] max_usd to serve longer"
        )
    return (
        f"the budget of ${budget:,.2f} would be crossed before training started (${spent:,.2f} spent, "
        f"${spent_with_stop:,.2f} with stopping the machine while the run was {record.state.value}); raise "
        "[budget] max_usd to continue"
    )
