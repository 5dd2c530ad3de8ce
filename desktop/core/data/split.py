"""Deterministic train/eval splits.

Examples are split stratified by length, so both sets see short and long examples alike; a running text holds out
its tail (its paragraphs are not independent examples: held-out text must be text the model did not train on).
"""

from __future__ import annotations

import random

STRATA = 10


def eval_indices(lengths: dict[int, int], eval_fraction: float, seed: int) -> set[int]:
    """Chooses the rows that go to the eval set.

    Args:
        lengths: Row id → token length, for the rows kept.
        eval_fraction: Share of rows for evaluation (0 for none).
        seed: The same seed and input always give the same split.

    Returns:
        The row ids of the eval set.
    """
    if eval_fraction <= 0 or not lengths:
        return set()
    ordered = sorted(lengths, key=lambda row: (lengths[row], row))
    size = max(1, len(ordered) // STRATA)
    rng = random.Random(seed)  # noqa: S311 - a reproducible split, not cryptography
    chosen: set[int] = set()
    for start in range(0, len(ordered), size):
        stratum = ordered[start : start + size]
        # Cumulative rounding: strata too small for a whole eval row still add up to the right total.
        take = round((start + len(stratum)) * eval_fraction) - round(start * eval_fraction)
        rng.shuffle(stratum)
        chosen.update(stratum[:take])
    return chosen


def tail_indices(lengths: dict[int, int], eval_fraction: float) -> set[int]:
    """The last rows (by row id) holding about ``eval_fraction`` of the tokens: held-out text from a running text.

    At least one row is held out (when asked and there are two or more), and never every row.
    """
    if eval_fraction <= 0 or len(lengths) < 2:
        return set()
    budget = sum(lengths.values()) * eval_fraction
    chosen: set[int] = set()
    held = 0
    for row in sorted(lengths, reverse=True):
        if chosen and held + lengths[row] > budget:
            break
        chosen.add(row)
        held += lengths[row]
    return chosen if len(chosen) < len(lengths) else set(sorted(lengths)[-1:])
