"""A compare report read back from its ``report.json``: what the app's report view shows.

The file was written by :func:`~desktop.services.evaluation.report.write_reports`, but it sits in a folder the user
owns: it is read field by field, and anything unexpected is one message naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.core.judging.checks import CheckKind
from desktop.core.judging.general import TaskScore
from desktop.core.judging.verdict import CheckScore, Outcome
from desktop.services.evaluation.general import GeneralCheck, general_lines
from desktop.services.evaluation.preference import (
    ANSWERS_HEADING,
    preference_from_json,
    preference_headline,
    preference_lines,
)
from desktop.services.evaluation.report import REPORT_FILES, outcome_words, score_line

#: The most flipped rows the view lists (the JSON and the HTML report hold them all).
SHOWN_FLIPS = 200


class SavedReportError(ValueError):
    """The report cannot be shown; the message names the file and what to do."""


@dataclass(frozen=True)
class FlippedRow:
    """A held-out row one model got right and the other wrong."""

    line: int
    prompt: str
    reference: str
    base_answer: str
    tuned_answer: str


@dataclass(frozen=True)
class SavedReport:
    """What a compare report says.

    Attributes:
        headline: The verdict in words.
        lines: The scores, the losses and the run, one fact per line.
        fixed: Rows the fine-tune got right and its base wrong.
        broke: Rows the base got right and the fine-tune wrong.
        losses: The run's (step, training loss) curve, when the adapter came from a recorded run.
        eval_losses: Its (step, held-out loss) curve.
        html: The HTML report beside it (the loss curves drawn, every row), when it is there.
        general_regressed: The general-ability check found a task the fine-tune lost beyond chance.
    """

    headline: str
    outcome: Outcome
    lines: list[str]
    fixed: list[FlippedRow] = field(default_factory=list)
    broke: list[FlippedRow] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    html: Path | None = None
    general_regressed: bool = False


def report_json_path(report: Path) -> Path:
    """The ``report.json`` of a report folder, or of the folder of any of its files."""
    folder = report if report.is_dir() else report.parent
    return folder / REPORT_FILES["json"]


def read_saved_report(report: Path) -> SavedReport:
    """Reads the report at ``report`` (its folder, or any of its files).

    Raises:
        SavedReportError: There is no ``report.json`` (an older report), or it is not one Rentune writes.
    """
    path = report_json_path(report)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return _parsed(data, path)
    except FileNotFoundError:
        raise SavedReportError(f"{path.parent} has no report.json (an older report): open it in the browser") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SavedReportError(
            f"{path} is not a report Rentune can read ({exc}): compare again to write a new one"
        ) from exc


def _parsed(data: Any, path: Path) -> SavedReport:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    outcome = Outcome(str(data["outcome"]))
    fixed, broke = _rows(data.get("fixed")), _rows(data.get("broke"))
    scores = [_score(item) for item in data.get("scores") or []]
    lines = [
        f"{len(fixed)} row(s) fixed, {len(broke)} broken (p = {float(data['p_value']):.3g}, exact McNemar test).",
        *(score_line(score) for score in scores),
        f"Mean loss on the reference answers (lower is better): base {float(data['base_loss']):.4f}, "
        f"tuned {float(data['tuned_loss']):.4f}.",
    ]
    judged_on = data.get("judged_on")
    if isinstance(judged_on, str) and judged_on != "this computer":
        lines.append(f"Answered on {judged_on[:200]}.")
    found = data.get("run")
    run: dict[str, Any] = found if isinstance(found, dict) else {}
    general = _general_lines(data.get("general"))
    headline = outcome_words(outcome, len(fixed), len(broke))
    preference = data.get("preference")
    if isinstance(preference, dict):  # a preference run (DPO, ORPO): its pairs lead, the answers follow
        check = preference_from_json(preference)
        headline, outcome = preference_headline(check)
        lines = [*preference_lines(check), ANSWERS_HEADING, *lines]
    lines += general
    html = path.with_name(REPORT_FILES["html"])
    return SavedReport(
        headline=headline,
        outcome=outcome,
        lines=lines + _run_lines(run),
        fixed=fixed[:SHOWN_FLIPS],
        broke=broke[:SHOWN_FLIPS],
        losses=_curve(run.get("losses")),
        eval_losses=_curve(run.get("eval_losses")),
        html=html if html.is_file() else None,
        general_regressed=bool(general) and general[0].startswith("Lost general ability"),
    )


def _score(item: Any) -> CheckScore:
    return CheckScore(
        CheckKind(str(item["check"])), int(item["base_right"]), int(item["tuned_right"]), int(item["rows"])
    )


def _rows(items: Any) -> list[FlippedRow]:
    if not isinstance(items, list):
        return []
    if not all(isinstance(item, dict) for item in items):
        raise ValueError("a flipped row is not a JSON object")
    keys = ("prompt", "reference", "base_answer", "tuned_answer")
    return [FlippedRow(int(item.get("line", 0)), *(str(item.get(key, "")) for key in keys)) for item in items]


def _curve(points: Any) -> list[tuple[int, float]]:
    if not isinstance(points, list):
        return []
    return [(int(step), float(loss)) for step, loss in points]


def _general_lines(general: Any) -> list[str]:
    """The general-ability check's lines, rebuilt from the JSON (none when it was not run)."""
    if not isinstance(general, dict):
        return []
    scores = [
        TaskScore(
            str(t["task"]), int(t["rows"]), float(t["base"]), float(t["tuned"]), float(t["low"]), float(t["high"])
        )
        for t in general.get("tasks") or []
    ]
    return general_lines(GeneralCheck(scores, str(general.get("harness") or "lm-evaluation-harness")))


def _run_lines(run: dict[str, Any]) -> list[str]:
    if not run:
        return []
    usd = run.get("usd")
    cost = f"${float(usd):,.2f}" if isinstance(usd, (int, float)) else "no cost recorded"
    where = f" on {run['gpu']}" if run.get("gpu") else ""
    hours = float(run.get("trained_seconds") or 0) / 3600
    return [
        f"Run {run.get('run_id', '')}: {run.get('method') or 'fine-tune'} of {run.get('base_model', '')}{where}, "
        f"trained for {hours:.2f} h, {cost}."
    ]
