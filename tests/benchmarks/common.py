"""Helpers shared by the benchmarks: timing child processes and printing side-by-side tables."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One line of a benchmark table: ours against a baseline measured in the same run."""

    name: str
    ours: float
    baseline: float | None
    unit: str
    target: str
    met: bool
    #: Shown beside the others without a target (printed as "info", never a miss).
    informational: bool = False
    #: The ratio to show when it is not ours over the baseline's (say, the median of paired runs' ratios).
    measured_ratio: float | None = None

    @property
    def ratio(self) -> str:
        if self.measured_ratio is not None:
            return f"{self.measured_ratio:.2f}x"
        return f"{self.ours / self.baseline:.2f}x" if self.baseline else "-"


def print_table(rows: Sequence[Row]) -> bool:
    """Prints the rows and returns whether every target was met."""
    print(f"{'measure':<42}{'rentune':>12}{'baseline':>12}{'ratio':>9}  target")
    for row in rows:
        baseline = f"{row.baseline:.3f}" if row.baseline is not None else "-"
        verdict = "info" if row.informational else "ok" if row.met else "MISSED"
        print(f"{row.name:<42}{row.ours:>10.3f} {row.unit:<1}{baseline:>11} {row.ratio:>8}  {row.target} {verdict}")
    return all(row.met for row in rows if not row.informational)


def time_until_line(args: Sequence[str], marker: str, env: dict[str, str] | None = None) -> float:
    """Starts a process and returns the seconds until it prints ``marker`` (a cold start as the user sees it)."""
    start = time.perf_counter()
    with subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=os.environ | (env or {})
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == marker:
                elapsed = time.perf_counter() - start
                proc.wait(timeout=30)
                return elapsed
        raise RuntimeError(f"{args} exited with {proc.wait()} without printing {marker!r}")


def median_interleaved(commands: dict[str, list[str]], marker: str, runs: int, env: dict[str, str]) -> dict[str, float]:
    """Times each command ``runs`` times, interleaved so machine noise hits all alike; returns medians."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, args in commands.items():
            samples[name].append(time_until_line(args, marker, env))
    return {name: statistics.median(values) for name, values in samples.items()}


PYTHON = sys.executable
