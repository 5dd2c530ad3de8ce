"""The general-ability check's verdict: each task's accuracy for base and tuned, and their paired difference.

Both models answer the same rows, so the difference is taken row by row (tuned minus base, each 0 or 1) and its 95 %
confidence interval is the normal one over those differences: ``mean ± 1.96 · sd / √n``. A task regressed when the
whole interval lies below zero (the fine-tune lost ground it is unlikely to have lost by chance), improved when it
lies above; else the check cannot tell them apart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import StrEnum

#: The normal quantile of a two-sided 95 % interval.
Z_95 = 1.96


class Drift(StrEnum):
    """What the fine-tune did to a task it was not trained for."""

    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "no clear change"


@dataclass(frozen=True)
class TaskScore:
    """One task of the general-ability check, base against tuned.

    Attributes:
        task: The task's name (``rentune_capitals``).
        rows: Rows both models answered.
        base: The base model's accuracy (0 to 1).
        tuned: The fine-tuned model's accuracy.
        low: The lower end of the 95 % interval of ``tuned - base``.
        high: Its upper end.
    """

    task: str
    rows: int
    base: float
    tuned: float
    low: float
    high: float

    @property
    def difference(self) -> float:
        """Tuned minus base accuracy."""
        return self.tuned - self.base

    @property
    def drift(self) -> Drift:
        """Regressed, improved, or no change the check can tell."""
        if self.high < 0:
            return Drift.REGRESSED
        if self.low > 0:
            return Drift.IMPROVED
        return Drift.UNCHANGED


def task_score(task: str, base: list[float], tuned: list[float]) -> TaskScore:
    """The scores of one task from each model's per-row results (0 or 1, the same rows in the same order).

    Raises:
        ValueError: The lists differ in length or are empty.
    """
    if len(base) != len(tuned) or not base:
        raise ValueError(f"{task}: {len(base)} base and {len(tuned)} tuned rows; both must answer the same rows")
    differences = [t - b for b, t in zip(base, tuned, strict=True)]
    mean = statistics.fmean(differences)
    spread = Z_95 * statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else 0.0
    return TaskScore(task, len(base), statistics.fmean(base), statistics.fmean(tuned), mean - spread, mean + spread)
