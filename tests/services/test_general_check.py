"""Reading the general-ability check's result: rows paired per task, and equal to the harness's own accuracy.

The check itself, with lm-evaluation-harness on the shipped tasks: tests/test_cli_compare.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from desktop.core.judging.general import Drift
from desktop.services.evaluation.general import read_check, tasks_folder


def result(base: list[float], tuned: list[float], said: dict[str, float] | None = None) -> dict[str, Any]:
    acc = said or {"base": sum(base) / len(base), "tuned": sum(tuned) / len(tuned)}
    rows = {"rows": list(range(len(base))), "base": base, "tuned": tuned, "harness_acc": acc}
    return {"tasks": {"rentune_capitals": rows}, "harness": "lm-evaluation-harness 0.4.13"}


def test_a_result_whose_rows_add_up_is_read_per_task() -> None:
    check = read_check(result([1.0] * 20, [1.0] * 10 + [0.0] * 10))
    [score] = check.scores
    assert (score.task, score.rows, score.base, score.tuned) == ("rentune_capitals", 20, 1.0, 0.5)
    assert score.drift is Drift.REGRESSED and check.harness == "lm-evaluation-harness 0.4.13"


@pytest.mark.parametrize(
    ("changed", "problem"),
    [
        (result([1.0, 0.0], [1.0, 1.0], {"base": 0.5, "tuned": 0.5}), "not the harness's own"),
        (result([1.0, 0.0], [1.0]), "both must answer the same rows"),
        ({"tasks": {"t": {"base": [1.0]}}}, "tuned"),
    ],
)
def test_a_result_that_does_not_add_up_is_refused(changed: dict[str, Any], problem: str) -> None:
    with pytest.raises((ValueError, KeyError), match=problem):
        read_check(changed)


def test_the_shipped_rows_are_right_answers() -> None:
    folder: Path = tasks_folder()
    for line in (folder / "arithmetic.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        question = row["context"].removeprefix("Question: What is ").removesuffix("?\nAnswer:")
        a, op, b = question.split(" ")
        expected = {"plus": int(a) + int(b), "minus": int(a) - int(b), "times": int(a) * int(b)}[op]
        assert row["completion"] == f" {expected}", row
    capitals = [json.loads(line) for line in (folder / "capitals.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(capitals) == 68 and all(len(set(row["choices"])) == 4 and 0 <= row["gold"] < 4 for row in capitals)
    assert capitals[0]["choices"][capitals[0]["gold"]] == "Paris"
    assert {"rentune_arithmetic", "rentune_capitals"} == {
        line.split(":", 1)[1].strip()
        for path in folder.glob("*.yaml")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("task:")
    }
