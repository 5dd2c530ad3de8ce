"""The money soak's short set (``make soak`` runs the long one): no invariant breaks under injected faults and kills.

Seeded random schedules that together fire every kind of fault, and a kill sweep over the money windows of a rental's
life at each provider (a process killed after each of those provider calls and state writes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from tests.soak.__main__ import coverage_table, kill_table
from tests.soak.faults import FAULT_KINDS
from tests.soak.money_soak import census, run_schedule, run_sweep, sweep_points

#: Seeds CI runs: together they fire every kind of fault (the test checks it, from what fired at the fakes).
SHORT_SEEDS = (1, 3, 4, 9)
#: Whether a queued fault meets its call, and when a machine is taken away, depend on timing (a loaded computer
#: settles a create's row before its run creates again): these seeds run, one at a time, only while a kind has not
#: fired yet.
SPARE_SEEDS = (2, 5, 6, 7, 8)

# A killed process's loop and sockets stay open on purpose (closing them would run its cleanup, which a kill skips).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.mark.timeout(600)
def test_the_short_seeds_fire_every_fault_kind_and_keep_every_money_invariant() -> None:
    fired: Counter[str] = Counter()
    for seed in seeds_until_every_kind_fired(fired):
        outcome = run_schedule(seed)
        assert outcome.rentals > 0 and outcome.checks > 0
        assert outcome.violations == [], "\n".join(outcome.violations + outcome.log)
        fired.update(outcome.faults)
    print("faults fired by kind:", *coverage_table(fired), sep="\n")
    assert unfired(fired) == [], "every kind of fault fires at least once"


def unfired(fired: Counter[str]) -> list[str]:
    """The kinds of fault that have not fired yet."""
    return [kind for kind in FAULT_KINDS if not fired[kind]]


def seeds_until_every_kind_fired(fired: Counter[str]) -> Iterator[int]:
    """The short seeds, then spare seeds one at a time while a kind has not fired (``fired`` is read as it grows)."""
    yield from SHORT_SEEDS
    for seed in SPARE_SEEDS:
        if not unfired(fired):
            return
        yield seed


@pytest.mark.timeout(300)
def test_a_process_killed_after_any_money_step_of_a_rental_leaves_nothing_billing() -> None:
    lives = census()
    points = sweep_points(lives, money_only=True)
    kills: Counter[str] = Counter()
    missed = 0
    for outcome in run_sweep(points):
        assert outcome.violations == [], "\n".join(outcome.violations + outcome.log)
        kills.update(outcome.kills)
        missed += outcome.missed
    print(f"{len(points)} kill points, {missed} not reached:", *kill_table(kills), sep="\n")
    assert sum(kills.values()) + missed == len(points)
    ends = [words for words in kills if "run -> finished" in words or "ledger.terminating" in words]
    assert ends, "kills between the adapter home and the terminate"
