"""The evaluation: a tiny model taught a pattern is judged better than its base, with its flips, losses and cost.

The model part runs for real (the tiny Llama and its pattern adapter, both answering on this computer); the checks on
JSON answers and a user's schema run on answers written here, in-process.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from desktop.core.judging.checks import CheckKind
from desktop.core.judging.verdict import Outcome
from desktop.services.evaluation.judge import JudgeOptions, judge_and_report, judge_comparison, read_schema
from desktop.services.evaluation.report import html_report, markdown_report, report_json, summary_lines
from desktop.services.local.common import LocalInputError
from desktop.services.local.compare import CompareExample, CompareResult
from desktop.services.runs.run_facts import read_run_facts
from desktop.services.runs.store import RunStore
from tests.fixtures.adapters import PATTERN, TrainedAdapter, write_pattern_jsonl
from tests.fixtures.exported_models import record_returned_run
from tests.fixtures.recorded_run import EVENTS


@pytest.mark.slow
def test_the_taught_adapter_is_judged_better_with_its_flips_loss_curve_and_cost(
    pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    store = RunStore()
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl", PATTERN * 2)  # 8 rows: enough for a clear verdict
    run_id = record_returned_run(
        store, pattern_adapter.path, base=str(pattern_adapter.base), rented_price=2.69, eval_file=eval_file
    )
    shutil.copy(EVENTS, store.folder(run_id) / "events.jsonl")
    judgement, written = asyncio.run(
        judge_and_report(
            str(pattern_adapter.base),
            pattern_adapter.path,
            eval_file,
            tmp_path / "out",
            run=read_run_facts(store, run_id, time.time()),
        )
    )
    verdict = judgement.verdict
    assert judgement.checks == [CheckKind.NORMALISED, CheckKind.EXACT]
    assert (verdict.scores[0].base_right, verdict.scores[0].tuned_right, verdict.scores[0].rows) == (0, 8, 8)
    assert verdict.outcome is Outcome.BETTER and verdict.p_value == 2 / 2**8
    assert [(row.prompt, row.tuned_answer) for row in verdict.fixed] == PATTERN * 2 and verdict.broke == []
    assert all(row.base_answer != row.reference for row in verdict.fixed), "each flip shows the base's answer too"

    lines = summary_lines(judgement)
    assert lines[0].startswith("The fine-tune is better at the task: 8 row(s) fixed, 0 broken (p = 0.00781")
    assert judgement.run is not None and judgement.run.usd is not None and judgement.run.usd > 0
    assert lines[-1].startswith(f"Run {run_id}: qlora of {pattern_adapter.base} on H100 80GB, trained for")
    assert lines[-1].endswith(f"${judgement.run.usd:,.2f}.")

    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["report.html", "report.json", "report.md"]
    page = written["html"].read_text(encoding="utf-8")
    assert page.count("<polyline") == 2, "the training and the held-out loss curves"
    assert "Fixed by the fine-tune (8)" in page and "Broken by the fine-tune (0)" in page
    saved = json.loads(written["json"].read_text(encoding="utf-8"))
    assert saved["outcome"] == "better" and len(saved["fixed"]) == 8 and len(saved["rows"]) == 8
    assert saved["run"]["losses"][0][0] == 1 and len(saved["run"]["eval_losses"]) > 1
    assert "Fixed by the fine-tune (8)" in written["markdown"].read_text(encoding="utf-8")


def _result(tmp_path: Path, rows: list[tuple[str, str, str]]) -> CompareResult:
    examples = [CompareExample(f"q{i}", ref, base, tuned, i + 1) for i, (ref, base, tuned) in enumerate(rows)]
    return CompareResult(
        tmp_path / "base", tmp_path / "adapter", tmp_path / "eval.jsonl", 2.0, 1.0, examples, len(rows)
    )


def test_json_answers_are_judged_by_their_keys_and_by_the_users_schema(tmp_path: Path) -> None:
    schema_file = tmp_path / "schema.json"
    schema = {"type": "object", "required": ["city", "days"], "properties": {"days": {"type": "integer"}}}
    schema_file.write_text(json.dumps(schema), encoding="utf-8")
    result = _result(
        tmp_path,
        [
            ('{"city": "Oslo", "days": 3}', "Oslo for three days", '{"city": "Bergen", "days": 2}'),
            ('{"city": "Rome", "days": 5}', '{"city": "Rome", "days": "five"}', '{"city": "Rome", "days": 5}'),
            ('{"city": "Bern", "days": 1}', '{"city": "Bern", "days": 1}', '```json\n{"city": "Bern"}\n```'),
        ],
    )
    options = JudgeOptions(schema_file=schema_file)
    judgement = judge_comparison(result, options, read_schema(schema_file), None)
    assert judgement.checks == [CheckKind.JSON_SCHEMA, CheckKind.JSON_KEYS]
    scores = {s.kind: (s.base_right, s.tuned_right) for s in judgement.verdict.scores}
    # base: prose, a string where the schema wants a number (same keys), right; tuned: right, right, a key short
    assert scores == {CheckKind.JSON_SCHEMA: (1, 2), CheckKind.JSON_KEYS: (2, 2)}
    assert [row.line for row in judgement.verdict.fixed] == [1, 2]
    assert [row.line for row in judgement.verdict.broke] == [3]
    assert "Leaning better, not yet clear" in summary_lines(judgement)[0]
    assert report_json(judgement)["deciding_check"] == "json_schema"


def test_a_regex_scores_every_answer_and_text_from_the_models_is_never_markup(tmp_path: Path) -> None:
    tricky = "</pre><script>alert(1)</script> ```"
    result = _result(tmp_path, [("Ticket #1234 opened", "Ticket opened", f"Ticket #1234 opened {tricky}")])
    judgement = judge_comparison(result, JudgeOptions(regex=r"#\d{4}\b"), None, None)
    assert judgement.checks == [CheckKind.NORMALISED, CheckKind.EXACT, CheckKind.REGEX]
    assert [(s.kind, s.base_right, s.tuned_right) for s in judgement.verdict.scores][-1] == (CheckKind.REGEX, 0, 1)
    page = html_report(judgement)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "````text" in markdown_report(judgement), "a fence longer than the answer's own"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{oops", "is not JSON"),
        ('{"type": 12}', "is not a valid JSON Schema"),
        ("[1, 2]", "is not a valid JSON Schema"),
    ],
)
def test_a_schema_file_that_is_no_schema_is_named(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "schema.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LocalInputError, match=problem):
        read_schema(path)
