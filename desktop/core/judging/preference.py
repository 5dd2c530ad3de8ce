"""The preference check's verdict: on held-out pairs, how often base and tuned find the chosen answer the likelier.

Each model scores a pair's two answers by their mean log-probability per token (the payload's
:mod:`trainer_payload.preference_check`); it prefers the chosen answer when that is the higher. Both models score the
same pairs, so the difference of their shares is paired, pair by pair, with the 95 % interval of
:func:`desktop.core.judging.general.task_score`: a preference run improved when the whole interval lies above zero.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from desktop.core.judging.general import TaskScore, task_score

#: The task name the interval is computed under.
PAIRS_TASK = "held-out pairs"


@dataclass(frozen=True)
class PairScore:
    """One held-out pair, scored by both models.

    Attributes:
        line: The pair's line in the eval file.
        base: The base model's mean log-probability per token of the chosen and the rejected answer.
        tuned: The tuned model's.
    """

    line: int
    base: tuple[float, float]
    tuned: tuple[float, float]

    @property
    def base_prefers_chosen(self) -> bool:
        """Whether the base finds the chosen answer the likelier."""
        return self.base[0] > self.base[1]

    @property
    def tuned_prefers_chosen(self) -> bool:
        """Whether the tuned model finds the chosen answer the likelier."""
        return self.tuned[0] > self.tuned[1]


@dataclass(frozen=True)
class PreferenceCheck:
    """Every pair's scores and what they add up to.

    Attributes:
        pairs: Each pair, in file order.
        share: The share of pairs each model prefers chosen in, and the paired 95 % interval of their difference.
        fixed: Pairs the base got wrong (preferred rejected) and the tuned model right.
        broke: Pairs the base got right and the tuned model wrong.
        base_margin: The base's mean of chosen minus rejected (log-probability per token).
        tuned_margin: The tuned model's.
    """

    pairs: list[PairScore]
    share: TaskScore
    fixed: int
    broke: int
    base_margin: float
    tuned_margin: float


def preference_check(pairs: list[PairScore]) -> PreferenceCheck:
    """Adds up the pairs' scores.

    Raises:
        ValueError: No pair was scored.
    """
    if not pairs:
        raise ValueError("no pair was scored")
    base = [float(pair.base_prefers_chosen) for pair in pairs]
    tuned = [float(pair.tuned_prefers_chosen) for pair in pairs]
    return PreferenceCheck(
        pairs=pairs,
        share=task_score(PAIRS_TASK, base, tuned),
        fixed=sum(t > b for b, t in zip(base, tuned, strict=True)),
        broke=sum(b > t for b, t in zip(base, tuned, strict=True)),
        base_margin=statistics.fmean(pair.base[0] - pair.base[1] for pair in pairs),
        tuned_margin=statistics.fmean(pair.tuned[0] - pair.tuned[1] for pair in pairs),
    )
