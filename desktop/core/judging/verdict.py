"""The verdict of base against tuned on held-out rows: scores per check, the rows that flipped, and whether it is clear.

Both models answer the same rows, so the comparison is paired: only the rows where one is right and the other wrong
tell them apart. The exact McNemar test (a two-sided binomial test on those rows) says how likely so lopsided a split
would be if the fine-tune changed nothing; below 5 % the verdict is "better" or "worse", else "no clear difference".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from math import comb

from desktop.core.judging.checks import CheckKind, normalise

#: Below this chance of a split as lopsided by luck alone, the verdict is clear.
CLEAR_BELOW = 0.05


class Outcome(StrEnum):
    """What the fine-tune did to the task, all rows together."""

    BETTER = "better"
    WORSE = "worse"
    UNCLEAR = "no clear difference"


@dataclass(frozen=True)
class RowScore:
    """One held-out row, scored: the check results of each model's answer.

    Attributes:
        line: The row's line in the eval file.
        prompt: What the models were asked (as text).
        reference: The answer the data expects.
        base_answer: The base model's answer.
        tuned_answer: The fine-tuned model's answer.
        base: Each check's result for the base answer.
        tuned: Each check's result for the tuned answer.
    """

    line: int
    prompt: str
    reference: str
    base_answer: str
    tuned_answer: str
    base: dict[CheckKind, bool]
    tuned: dict[CheckKind, bool]


@dataclass(frozen=True)
class CheckScore:
    """How many rows each model got right under one check."""

    kind: CheckKind
    base_right: int
    tuned_right: int
    rows: int


@dataclass(frozen=True)
class LabelScore:
    """One label's rows and how many each model got right."""

    label: str
    rows: int
    base_right: int
    tuned_right: int


@dataclass(frozen=True)
class Verdict:
    """Base against tuned on the task.

    Attributes:
        deciding: The check that says right or wrong (the first chosen).
        scores: Every check's score, the deciding one first.
        fixed: Rows the base got wrong and the fine-tune right.
        broke: Rows the base got right and the fine-tune wrong.
        p_value: The exact McNemar test's two-sided p-value on the flipped rows.
        labels: Per label, for a label task (empty otherwise).
    """

    deciding: CheckKind
    scores: list[CheckScore]
    fixed: list[RowScore]
    broke: list[RowScore]
    p_value: float
    labels: list[LabelScore] = field(default_factory=list)

    @property
    def outcome(self) -> Outcome:
        """Better, worse, or no clear difference."""
        if self.p_value >= CLEAR_BELOW or len(self.fixed) == len(self.broke):
            return Outcome.UNCLEAR
        return Outcome.BETTER if len(self.fixed) > len(self.broke) else Outcome.WORSE


def mcnemar_p(fixed: int, broke: int) -> float:
    """The exact two-sided McNemar p-value for ``fixed`` against ``broke`` flipped rows (1.0 with none)."""
    flipped = fixed + broke
    if flipped == 0:
        return 1.0
    tail = sum(comb(flipped, k) for k in range(min(fixed, broke) + 1)) / 2**flipped
    return float(min(1.0, 2 * tail))


def judge(rows: list[RowScore], checks: list[CheckKind]) -> Verdict:
    """Scores ``rows`` under ``checks`` (the first decides) and lists the flips.

    Raises:
        ValueError: No rows, or no check.
    """
    if not rows or not checks:
        raise ValueError("a verdict needs at least one scored row and one check")
    deciding = checks[0]
    scores = [
        CheckScore(kind, sum(row.base[kind] for row in rows), sum(row.tuned[kind] for row in rows), len(rows))
        for kind in checks
    ]
    fixed = [row for row in rows if row.tuned[deciding] and not row.base[deciding]]
    broke = [row for row in rows if row.base[deciding] and not row.tuned[deciding]]
    labels = _label_scores(rows) if deciding is CheckKind.LABEL else []
    return Verdict(deciding, scores, fixed, broke, mcnemar_p(len(fixed), len(broke)), labels)


def _label_scores(rows: list[RowScore]) -> list[LabelScore]:
    by_label: dict[str, list[RowScore]] = {}
    for row in rows:
        by_label.setdefault(normalise(row.reference), []).append(row)
    return [
        LabelScore(
            label,
            len(members),
            sum(row.base[CheckKind.LABEL] for row in members),
            sum(row.tuned[CheckKind.LABEL] for row in members),
        )
        for label, members in sorted(by_label.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
