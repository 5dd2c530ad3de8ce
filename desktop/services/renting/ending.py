"""No machine bills after its run ended: its rows go ``terminating`` first, and every start ends what is left.

Every end of a run (the adapter home, a failure, a stop, the budget) is written through
:meth:`~desktop.services.runs.context.RunContext.end`, which calls the context's ``before_end`` first. Set here, it
marks the run's live machines ``terminating`` in the ledger: a process killed at any moment between that write and
the provider confirming the machine gone leaves a row the next start terminates until gone
(:mod:`.reconcile`), never a live row behind an ended run. A live row behind an ended run that an older version (or
a path outside the driver) left is found by :func:`to_settle` and terminated at every start all the same.

Light on imports: the CLI asks :func:`to_settle` before every settling command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from desktop.core.runs.progress import ENDED
from desktop.services.billing.ledger import UNSETTLED_STATES, Ledger, Rental, RentalState

if TYPE_CHECKING:
    from desktop.services.runs.context import RunContext
    from desktop.services.runs.store import RunStore


def mark_terminating(ledger: Ledger, run_id: str) -> list[Rental]:
    """Marks every live machine of the run ``terminating`` (a cluster as one); returns those it marked."""
    marked = []
    for machine in ledger.machines(run_id):
        if machine.state is RentalState.LIVE and machine.instance_id is not None:
            ledger.terminating(machine.provider, machine.instance_id)
            marked.append(machine)
    return marked


def end_rentals_first(ctx: RunContext, ledger: Ledger) -> None:
    """Makes every end of a run in ``ctx`` mark the run's live machines ``terminating`` first."""

    def before_end(run_id: str) -> None:
        mark_terminating(ledger, run_id)

    ctx.before_end = before_end


def ended_runs(store: RunStore) -> set[str]:
    """The ids of the runs that have ended (finished, failed or cancelled): none of their machines may bill."""
    return {record.id for record in store.all() if record.state in ENDED}


def left_running(machine: Rental, ended: set[str]) -> bool:
    """Whether the machine is live although its run (one of ``ended``) has ended: nothing else would terminate it."""
    return machine.state is RentalState.LIVE and machine.run_id in ended


def to_settle(ledger: Ledger, store: RunStore) -> list[Rental]:
    """Every machine a start settles, oldest first: ``creating`` or ``terminating``, or live after its run ended."""
    ended = ended_runs(store)
    return [m for m in ledger.machines() if m.state in UNSETTLED_STATES or left_running(m, ended)]
