"""Even-width histogram of example lengths, sized so the sequence length falls inside the plotted range."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BARS = 40


@dataclass(frozen=True)
class LengthBar:
    """One bar of a length histogram.

    Attributes:
        start: Shortest length counted in the bar (tokens).
        width: Lengths covered: ``start`` to ``start + width - 1``.
        count: Examples of those lengths.
    """

    start: int
    width: int
    count: int


def length_histogram(lengths: Sequence[int], seq_len: int, bars: int = DEFAULT_BARS) -> list[LengthBar]:
    """Counts examples in ``bars`` equal-width bars from 0 to past the longest example and the sequence length.

    Args:
        lengths: Token length of each example.
        seq_len: The training sequence length (the range always reaches past it, so it can be marked).
        bars: Number of bars.

    Returns:
        The bars in order; empty when there are no lengths.
    """
    if not lengths or bars < 1:
        return []
    top = max(*lengths, seq_len) + 1
    width = max(1, math.ceil(top / bars))
    counts = [0] * math.ceil(top / width)
    for length in lengths:
        counts[min(max(length, 0) // width, len(counts) - 1)] += 1
    return [LengthBar(index * width, width, count) for index, count in enumerate(counts)]
