"""The general-ability check's verdict: paired differences, their 95 % interval, and regressed or not."""

from __future__ import annotations

import math

import pytest

from desktop.core.judging.general import Drift, task_score


def test_a_task_the_fine_tune_forgot_is_regressed_with_its_paired_interval() -> None:
    base = [1.0] * 40
    tuned = [1.0] * 30 + [0.0] * 10  # 10 of 40 rows lost, none gained
    score = task_score("rentune_capitals", base, tuned)
    assert (score.rows, score.base, score.tuned, score.difference) == (40, 1.0, 0.75, -0.25)
    sd = math.sqrt(sum((d + 0.25) ** 2 for d in [0.0] * 30 + [-1.0] * 10) / 39)
    assert score.low == pytest.approx(-0.25 - 1.96 * sd / math.sqrt(40))
    assert score.high == pytest.approx(-0.25 + 1.96 * sd / math.sqrt(40)) and score.high < 0
    assert score.drift is Drift.REGRESSED


def test_a_few_flips_either_way_are_no_clear_change() -> None:
    score = task_score("rentune_arithmetic", [1.0, 0.0, 1.0, 0.0] * 10, [0.0, 1.0, 1.0, 0.0] * 10)
    assert score.difference == 0.0 and score.low < 0 < score.high and score.drift is Drift.UNCHANGED


def test_gains_beyond_chance_are_improved() -> None:
    assert task_score("t", [0.0] * 30, [1.0] * 20 + [0.0] * 10).drift is Drift.IMPROVED


def test_rows_that_do_not_pair_are_refused() -> None:
    with pytest.raises(ValueError, match="both must answer the same rows"):
        task_score("t", [1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="both must answer the same rows"):
        task_score("t", [], [])
