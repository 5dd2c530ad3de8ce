"""The general-ability check of an evaluation: did the fine-tune lose what the base could do besides its task?

EleutherAI's lm-evaluation-harness scores base and tuned on small tasks shipped in ``resources/general-check``
(arithmetic and world capitals, their rows beside their task files, so it runs offline) in a child Python
(:mod:`trainer_payload.general_check`); each task's accuracies and the 95 % interval of their row-by-row difference
come from :mod:`desktop.core.judging.general`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.judging.general import Drift, TaskScore, task_score
from desktop.services.local.common import LocalToolError, Progress, no_progress
from desktop.services.local.compare import run_model_child
from desktop.services.platform.resources import resources_root

#: The shipped tasks' folder, below ``resources/``.
TASKS_FOLDER = "general-check"
#: Task names as the harness knows them, and as the report says them.
TASK_TITLES = {"rentune_arithmetic": "arithmetic", "rentune_capitals": "world capitals"}


@dataclass(frozen=True)
class GeneralCheck:
    """The general-ability check: each task's scores, and the harness that scored them."""

    scores: list[TaskScore]
    harness: str


def tasks_folder() -> Path:
    """The folder of the shipped lm-evaluation-harness tasks (their ``*.yaml`` and rows)."""
    return Path(str(resources_root() / TASKS_FOLDER))


async def check_general_ability(base: Path, adapter: Path, progress: Progress = no_progress) -> GeneralCheck:
    """Scores base and tuned on the shipped tasks with lm-evaluation-harness.

    Raises:
        LocalToolError: The harness failed, the base or adapter does not load, or its result cannot be read.
    """
    job = {"base": str(base), "adapter": str(adapter), "tasks": str(tasks_folder())}
    with tempfile.TemporaryDirectory(prefix="rentune-datasets-") as cache:  # the harness's Arrow copies of the rows
        env = {"HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": cache}
        result = await run_model_child(
            "trainer_payload.general_check",
            job,
            base,
            adapter,
            progress,
            what="the general-ability check",
            extra_env=env,
        )
    try:
        return read_check(result)
    except (KeyError, TypeError, ValueError) as exc:
        raise LocalToolError(f"the general-ability check's result cannot be read ({exc}); please report it") from exc


def read_check(result: dict[str, Any]) -> GeneralCheck:
    """The check from the child's result; each task's rows must add up to the harness's own accuracy.

    Raises:
        ValueError: A task's rows are missing or unpaired, or their mean is not the accuracy the harness reported.
    """
    scores = []
    for name, rows in sorted(dict(result["tasks"]).items()):
        score = task_score(name, [float(x) for x in rows["base"]], [float(x) for x in rows["tuned"]])
        said = rows["harness_acc"]
        if abs(score.base - float(said["base"])) > 1e-9 or abs(score.tuned - float(said["tuned"])) > 1e-9:
            raise ValueError(f"{name}: the rows' accuracy is not the harness's own ({said})")
        scores.append(score)
    return GeneralCheck(scores, str(result.get("harness") or "lm-evaluation-harness"))


def task_title(task: str) -> str:
    """``world capitals`` for ``rentune_capitals`` (a task of another name as it is)."""
    return TASK_TITLES.get(task, task)


def _percent(value: float) -> str:
    return f"{value:.0%}"


def _points(value: float) -> str:
    return f"{value * 100:+.0f}"


def score_line(score: TaskScore) -> str:
    """``world capitals: base 93%, tuned 90% (-3 points, 95% interval -8 to +2): no clear change``."""
    return (
        f"{task_title(score.task)}: base {_percent(score.base)}, tuned {_percent(score.tuned)} "
        f"({_points(score.difference)} points, 95% interval {_points(score.low)} to {_points(score.high)}, "
        f"{score.rows} rows): {score.drift.value}"
    )


def regressed_words(check: GeneralCheck) -> str | None:
    """``Lost general ability beyond chance: world capitals (-18 points).``, or None when no task regressed."""
    lost = [s for s in check.scores if s.drift is Drift.REGRESSED]
    if not lost:
        return None
    return (
        "Lost general ability beyond chance: "
        + ", ".join(f"{task_title(s.task)} ({_points(s.difference)} points)" for s in lost)
        + "."
    )


def general_lines(check: GeneralCheck) -> list[str]:
    """The check in plain lines: a regression first when there is one, which harness, then one line per task."""
    regressed = regressed_words(check)
    return [
        *([regressed] if regressed else []),
        f"General ability ({check.harness}, shipped tasks, offline):",
        *(score_line(s) for s in check.scores),
    ]


def table_rows(check: GeneralCheck) -> list[tuple[str, str, str, str, str]]:
    """(task, base, tuned, difference with its interval, verdict) per task, for the Markdown and HTML tables."""
    return [
        (
            task_title(s.task),
            _percent(s.base),
            _percent(s.tuned),
            f"{_points(s.difference)} ({_points(s.low)} to {_points(s.high)})",
            s.drift.value,
        )
        for s in check.scores
    ]


def general_json(check: GeneralCheck) -> dict[str, Any]:
    """The check as the JSON report holds it."""
    return {
        "harness": check.harness,
        "tasks": [
            {
                "task": s.task,
                "rows": s.rows,
                "base": s.base,
                "tuned": s.tuned,
                "difference": s.difference,
                "low": s.low,
                "high": s.high,
                "drift": s.drift.value,
            }
            for s in check.scores
        ],
    }
