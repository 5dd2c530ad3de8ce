"""``python -m tests.soak [--seeds N] [--first S] [--runs R] [--no-sweep]``: the long money soak (``make soak``).

First a census counts the provider calls and state writes of a fault-free rental's life at each provider; then the
kill sweep kills a process after each of them, for every n; then the seeded random schedules run. Prints what they
did (schedules, rentals, kills by point, faults fired by kind, |booked - billed|) and every invariant break; exit 1
on any.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.soak.faults import FAULT_KINDS
from tests.soak.money_soak import Outcome, census, is_call, run_schedule, run_sweep, sweep_points


@dataclass
class Tally:
    """What every schedule of the soak did together."""

    schedules: int = 0
    rentals: int = 0
    checks: int = 0
    missed: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    breaks: list[str] = field(default_factory=list)
    gaps: list[tuple[float, str]] = field(default_factory=list)
    unknowable: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        """Adds one schedule's outcome, and says it in one line."""
        self.schedules += 1
        self.rentals += outcome.rentals
        self.checks += outcome.checks
        self.missed += outcome.missed
        self.kills.update(outcome.kills)
        self.faults.update(outcome.faults)
        self.breaks += outcome.violations
        self.gaps += outcome.gaps
        self.unknowable += [f"{outcome.name}: {machine}" for machine in outcome.unknowable]
        for line in outcome.log:
            print(f"    | {line}")
        print(
            f"{outcome.name}: {outcome.rentals} rentals, {sum(outcome.kills.values())} kills, "
            f"{sum(outcome.faults.values())} faults fired, {len(outcome.violations)} breaks",
            flush=True,
        )


def coverage_table(faults: Counter[str]) -> list[str]:
    """Each fault kind the soak injects, with how often it fired."""
    return [f"  {faults[kind]:5d}  {kind}" for kind in FAULT_KINDS]


def kill_table(kills: Counter[str]) -> list[str]:
    """Kills by point: each kind of point (provider call, state write) with the steps it followed."""
    steps: Counter[str] = Counter()
    for words, count in kills.items():
        steps[re.sub(r" #\d+", "", words)] += count  # "after provider call GET /v2/pods/{id} #3": one row per step
    return [f"  {count:5d}  {words}" for words, count in sorted(steps.items(), key=lambda item: (-item[1], item[0]))]


def gap_lines(gaps: Iterable[tuple[float, str]]) -> list[str]:
    """|booked - billed| per way an end was known: rentals, median and largest (seconds of the machine's time)."""
    lines = []
    for kind in ("reported", "estimated", "noticed"):
        seconds = sorted(abs(gap) for gap, how in gaps if how == kind)
        if seconds:
            median, largest = seconds[len(seconds) // 2], seconds[-1]
            lines.append(f"  ends {kind}: {len(seconds)} rentals, median {median:.3f} s, max {largest:.3f} s")
    return lines


def main() -> int:
    """Runs the census, the kill sweep and the seeded schedules, then prints the figures and every break."""
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--seeds", type=int, default=60, help="random schedules to run (default 60)")
    parser.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--runs", type=int, default=4, help="runs per random schedule (default 4)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the census and the kill sweep")
    args = parser.parse_args()
    started, tally = time.monotonic(), Tally()
    if not args.no_sweep:
        lives = census()
        for name, trail in lives.items():
            calls = sum(1 for step in trail if is_call(step))
            print(f"a rental's life at {name.label}: {calls} provider calls, {len(trail) - calls} state writes")
        for outcome in run_sweep(sweep_points(lives)):
            tally.add(outcome)
    for seed in range(args.first, args.first + args.seeds):
        tally.add(run_schedule(seed, args.runs))
    print(
        f"\n{tally.schedules} schedules, {tally.rentals} rentals, {sum(tally.kills.values())} processes killed and "
        f"restarted ({tally.missed} kill points not reached), {tally.checks} checks while running, "
        f"{sum(tally.faults.values())} faults fired, in {time.monotonic() - started:.0f} s"
    )
    print("kills by point:", *kill_table(tally.kills), sep="\n")
    print("faults fired by kind:", *coverage_table(tally.faults), sep="\n")
    print("|booked - billed|:", *gap_lines(tally.gaps), sep="\n")
    print(
        f"machines lost by their provider before any answer named them (no client can book them): "
        f"{len(tally.unknowable)}",
        *(f"  {machine}" for machine in tally.unknowable),
        sep="\n",
    )
    print(f"invariant breaks: {len(tally.breaks)}", *(f"  {line}" for line in tally.breaks), sep="\n")
    return 1 if tally.breaks else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # killed processes' tasks are never cleaned up, not even at exit (they would act after death)
