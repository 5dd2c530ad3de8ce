"""The preference check of an evaluation: on a preference run's held-out pairs (DPO, ORPO), base against tuned.

The pairs are read by the data service, as the machine reads them; the payload's
:mod:`trainer_payload.preference_check` scores each pair's two answers with both models in a child Python; the
verdict is :mod:`desktop.core.judging.preference`'s. The report says it beside the chat side by side.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from desktop.core.data.formats import DataFormat
from desktop.core.data.report import DataReport
from desktop.core.judging.general import Drift
from desktop.core.judging.preference import PairScore, PreferenceCheck, preference_check
from desktop.core.judging.verdict import Outcome
from desktop.services.data.check import CheckOutcome, iter_training_rows
from desktop.services.data.reader import DatasetFileError
from desktop.services.local.common import LocalInputError, LocalToolError, Progress, no_progress
from desktop.services.local.compare import run_model_child
from trainer_payload.protocol import Pair


def read_pairs(path: Path, max_pairs: int) -> list[tuple[int, Pair]]:
    """The first ``max_pairs`` usable pairs of ``path`` with their lines; [] when the file holds chats, not pairs.

    Raises:
        LocalToolError: The file cannot be read.
    """
    outcome = CheckOutcome(DataReport(str(path)))
    pairs: list[tuple[int, Pair]] = []
    try:
        for line, row in iter_training_rows(path, outcome, None, None):
            if outcome.fmt is not DataFormat.PAIRS or len(pairs) == max_pairs:
                break
            pairs.append((line, row))
    except DatasetFileError as exc:
        raise LocalInputError(str(exc)) from exc
    except OSError as exc:
        raise LocalInputError(f"{path} cannot be read ({exc.strerror or exc}); check the file") from exc
    return pairs


async def check_preferences(
    base: Path, adapter: Path, pairs: list[tuple[int, Pair]], progress: Progress = no_progress
) -> PreferenceCheck:
    """Scores each pair's answers with the tuned model and its base, and adds them up.

    Raises:
        LocalToolError: The base or adapter does not load, or the child's result cannot be read.
    """
    with tempfile.TemporaryDirectory(prefix="rentune-pairs-") as scratch:
        rows = Path(scratch) / "pairs.jsonl"
        rows.write_text("".join(json.dumps({"line": line, "pair": pair}) + "\n" for line, pair in pairs), "utf-8")
        job = {"base": str(base), "adapter": str(adapter), "pairs": str(rows)}
        result = await run_model_child(
            "trainer_payload.preference_check", job, base, adapter, progress, what="the preference check"
        )
    try:
        return preference_check([_pair_score(item) for item in result["pairs"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise LocalToolError(f"the preference check's result cannot be read ({exc}); see the log") from exc


def _pair_score(item: dict[str, Any]) -> PairScore:
    base, tuned = item["base"], item["tuned"]
    return PairScore(int(item["line"]), (float(base[0]), float(base[1])), (float(tuned[0]), float(tuned[1])))


def _share(count: float, total: int) -> str:
    return f"{round(count * total):,} ({count:.0%})"


def _points(value: float) -> str:
    return f"{value * 100:+.0f}"


#: Leads the chat side by side in a preference run's report: its references are the chosen answers.
ANSWERS_HEADING = "Answers to the held-out prompts, judged against each pair's chosen answer:"
#: The report's headline for a preference run, by what the paired interval says.
_HEADLINES = {
    Drift.IMPROVED: "The fine-tune prefers the chosen answers more often than its base",
    Drift.REGRESSED: "The fine-tune prefers the chosen answers less often than its base",
    Drift.UNCHANGED: "No clear change in how often the chosen answer is preferred (more held-out pairs would tell)",
}
_OUTCOMES = {Drift.IMPROVED: Outcome.BETTER, Drift.REGRESSED: Outcome.WORSE, Drift.UNCHANGED: Outcome.UNCLEAR}


def preference_headline(check: PreferenceCheck) -> tuple[str, Outcome]:
    """What a preference run's report leads with, and the outcome it amounts to."""
    drift = check.share.drift
    return _HEADLINES[drift], _OUTCOMES[drift]


def preference_lines(check: PreferenceCheck) -> list[str]:
    """The check in plain lines: each model's share of pairs preferring the chosen answer, the flips, the margins."""
    share = check.share
    return [
        f"Preference on {share.rows:,} held-out pairs: the tuned model finds the chosen answer the likelier in "
        f"{_share(share.tuned, share.rows)}, its base in {_share(share.base, share.rows)}: "
        f"{_points(share.difference)} points (95% interval {_points(share.low)} to {_points(share.high)}), "
        f"{share.drift.value}.",
        f"{check.fixed:,} pair(s) turned to the chosen answer, {check.broke:,} away from it; mean margin of chosen "
        f"over rejected per token: base {check.base_margin:+.3f}, tuned {check.tuned_margin:+.3f}.",
    ]


def preference_json(check: PreferenceCheck) -> dict[str, Any]:
    """The check as the JSON report holds it (every pair's scores, so it can be read back whole)."""
    share = check.share
    return {
        "rows": share.rows,
        "base": share.base,
        "tuned": share.tuned,
        "low": share.low,
        "high": share.high,
        "fixed": check.fixed,
        "broke": check.broke,
        "base_margin": check.base_margin,
        "tuned_margin": check.tuned_margin,
        "pairs": [{"line": p.line, "base": list(p.base), "tuned": list(p.tuned)} for p in check.pairs],
    }


def preference_from_json(data: dict[str, Any]) -> PreferenceCheck:
    """The check from :func:`preference_json`'s JSON.

    Raises:
        KeyError, TypeError, ValueError: It is not that JSON.
    """
    return preference_check([_pair_score(item) for item in data["pairs"]])
