"""``python -m tests.soak [--seeds N] [--first S] [--runs R]``: the long money soak; exit 1 on any invariant break."""

from __future__ import annotations

import argparse
import os
import sys
import time

from tests.soak.money_soak import run_schedule


def main() -> int:
    """Runs the schedules and prints what they did, then every invariant break."""
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--seeds", type=int, default=60, help="schedules to run (default 60)")
    parser.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--runs", type=int, default=4, help="runs per schedule (default 4)")
    args = parser.parse_args()
    started = time.monotonic()
    rentals, kills, faults, breaks, gaps = 0, 0, {}, [], []
    for seed in range(args.first, args.first + args.seeds):
        outcome = run_schedule(seed, args.runs)
        rentals, kills = rentals + outcome.rentals, kills + outcome.kills
        for kind, count in outcome.faults.items():
            faults[kind] = faults.get(kind, 0) + count
        breaks += outcome.violations
        gaps += outcome.gaps
        for line in outcome.log:
            print(f"    | {line}")
        print(
            f"seed {seed}: {outcome.rentals} rentals, {outcome.kills} kills, {sum(outcome.faults.values())} "
            f"faults, {len(outcome.violations)} breaks",
            flush=True,
        )
    print(
        f"\n{args.seeds} schedules, {rentals} rentals, {kills} processes killed and restarted, "
        f"{sum(faults.values())} faults injected in {time.monotonic() - started:.0f} s:"
    )
    for kind, count in sorted(faults.items()):
        print(f"  {count:4d}  {kind}")
    for kind in ("reported", "estimated", "noticed"):
        seconds = sorted(abs(gap) for gap, how in gaps if how == kind)
        if seconds:
            median, largest = seconds[len(seconds) // 2], seconds[-1]
            print(f"|booked - billed|, ends {kind}: {len(seconds)} rentals, median {median:.3f} s, max {largest:.3f} s")
    print(f"invariant breaks: {len(breaks)}")
    for line in breaks:
        print(f"  {line}")
    return 1 if breaks else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # killed processes' tasks are never cleaned up, not even at exit (they would act after death)
