"""The money soak's short seed set (``make soak`` runs the long one): no invariant breaks under injected faults."""

from __future__ import annotations

import pytest

from tests.soak.money_soak import run_schedule

#: Seeds CI runs: together they inject every kind of fault, kills included.
SHORT_SEEDS = (1, 2, 3)


@pytest.mark.timeout(300)
# A killed process's loop and sockets stay open on purpose (closing them would run its cleanup, which a kill skips).
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("seed", SHORT_SEEDS)
def test_a_fault_schedule_keeps_every_money_invariant(seed: int) -> None:
    outcome = run_schedule(seed)
    assert outcome.rentals > 0 and sum(outcome.faults.values()) > 0
    assert outcome.violations == [], "\n".join(outcome.violations + outcome.log)
