"""The data check and preparation of preference pairs (DPO, ORPO): planted defects named by line and kind, the
length bias said for the file, pairs prepared whole into the shape the machine trains, and the wizard's workspace
preparing a pair file and previewing both answers of each pair."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from desktop.cli import main
from desktop.core.data.findings import Code
from desktop.services.data.check import check_dataset
from desktop.services.data.prepare import prepare_dataset
from desktop.services.data.workspace import check_and_prepare
from tests.fixtures.preference_data import preference_pairs
from trainer_payload.preferences import load_pairs

USER = [{"role": "user", "content": "Which one?"}]


def answer(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def write_rows(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def distinct_pairs(count: int) -> list[dict[str, Any]]:
    """``count`` pairs that differ from each other (no duplicates), chosen and rejected of one length."""
    return [
        {"prompt": [{"role": "user", "content": f"Question {n}?"}], "chosen": answer(f"Right {n}."),
         "rejected": answer(f"Wrong {n}.")}
        for n in range(count)
    ]  # fmt: skip


def test_each_planted_defect_is_named_with_its_line_and_kind(tmp_path: Path) -> None:
    rows: list[Any] = distinct_pairs(12)
    rows[1] = {"prompt": USER, "chosen": answer("Yes.")}  # line 2
    rows[3] = {"prompt": USER, "chosen": answer("Same."), "rejected": answer("Same.")}  # line 4
    rows[5] = {"chosen": USER + answer("a"), "rejected": [{"role": "user", "content": "Other?"}, *answer("b")]}
    rows[7] = {"prompt": USER, "chosen": answer("  "), "rejected": answer("No.")}  # line 8
    rows[9] = {"prompt": "Plain?", "chosen": "a", "rejected": "b"}  # line 10: another form
    rows[11] = {"prompt": USER, "chosen": answer("word " * 200), "rejected": answer("Short.")}  # line 12
    report = check_dataset(write_rows(tmp_path / "pairs.jsonl", rows), seq_len=64).report
    assert report.format.startswith("preference pairs") and (report.rows, report.valid) == (12, 8)
    lines = {code: summary.lines for code, summary in report.summaries.items()}
    assert lines == {
        Code.MISSING_SIDE: [2],
        Code.SAME_ANSWERS: [4],
        Code.PROMPT_DIFFERS: [6],
        Code.EMPTY_CONTENT: [8],
        Code.PAIR_SHAPE: [10],
        Code.TOO_LONG: [12],
    }
    (cut,) = report.summaries[Code.TOO_LONG].details
    assert re.fullmatch(r"line 12: chosen \d+ tokens, \d+ cut", cut), "the side cut is named, the other is not"
    assert "plain text, the file's first is chat messages" in report.summaries[Code.PAIR_SHAPE].details[0]


def test_a_file_whose_chosen_answers_are_longer_throughout_is_told_of_its_length_bias(tmp_path: Path) -> None:
    biased = [dict(pair, chosen=answer(f"A much longer and better answer, number {n}.")) for n, pair in
              enumerate(distinct_pairs(30))]  # fmt: skip
    report = check_dataset(write_rows(tmp_path / "biased.jsonl", biased)).report
    (note,) = report.notes
    assert note.startswith("length bias: the chosen answer is the longer one in 100% of 30 pairs") and "DPO" in note
    balanced = check_dataset(write_rows(tmp_path / "balanced.jsonl", distinct_pairs(30))).report
    assert balanced.notes == [] and check_dataset(write_rows(tmp_path / "few.jsonl", biased[:10])).report.notes == []


def test_prepared_pairs_are_whole_deduplicated_and_read_by_the_machine_as_written(tmp_path: Path) -> None:
    rows = [*preference_pairs(64), {"prompt": USER, "chosen": answer("Same."), "rejected": answer("Same.")}]
    rows.append({"prompt": USER, "chosen": answer("Yes.")})  # an error: left out
    prepared = prepare_dataset(write_rows(tmp_path / "pairs.jsonl", rows), tmp_path / "out", eval_fraction=0.25)
    counts = prepared.manifest_data["counts"]
    distinct = {json.dumps(pair, sort_keys=True) for pair in preference_pairs(64)}
    assert counts["train"] + counts["eval"] == len(distinct) and counts["eval"] >= 2, counts
    assert counts["with_errors"] == 1 and counts["duplicates_removed"] == 64 - len(distinct)
    assert prepared.eval is not None
    written = [json.loads(line) for path in (prepared.train, prepared.eval) for line in path.read_text().splitlines()]
    assert {json.dumps(pair, sort_keys=True) for pair in written} == distinct, (
        "every pair whole, the same-answer one out"
    )
    assert len(load_pairs(prepared.train)) == counts["train"], "the machine reads the prepared file as it is"
    lengths = check_dataset(tmp_path / "pairs.jsonl").kept_lengths()
    tokens = prepared.manifest_data["tokens"]
    assert tokens["sequences_per_example"] == 2, "the planner counts both answers of a pair"
    assert tokens["trained_per_epoch"] == 2 * sum(min(n, 2048) for n in lengths.values())


def test_rentune_plan_counts_both_answers_of_each_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = write_rows(tmp_path / "pairs.jsonl", distinct_pairs(40))
    assert main(["plan", "--model", "qwen2.5-0.5b", "--objective", "dpo", "--dataset", str(pairs), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    lengths = check_dataset(pairs).kept_lengths()
    assert plan["tokens"]["per_epoch"] == 2 * sum(lengths.values()) and plan["setup"]["objective"] == "dpo"


def test_rentune_data_check_lists_a_pairs_findings_and_its_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [dict(p, chosen=answer(f"A longer answer than the other, {n}.")) for n, p in enumerate(distinct_pairs(25))]
    rows[0] = {"prompt": USER, "rejected": answer("No.")}
    assert main(["data", "check", str(write_rows(tmp_path / "pairs.jsonl", rows))]) == 1
    out = capsys.readouterr().out
    assert "a side of the pair missing (lines 1)" in out and "line 1: the chosen side is missing" in out
    assert "Note: length bias: the chosen answer is the longer one in 100% of 24 pairs" in out


def test_the_wizard_prepares_a_pair_file_whole_and_previews_each_pairs_two_answers(tmp_path: Path) -> None:
    rows = [dict(p, chosen=answer(f"A longer answer than the other, {n}.")) for n, p in enumerate(distinct_pairs(30))]
    check = check_and_prepare(write_rows(tmp_path / "pairs.jsonl", rows), seq_len=512)
    assert check.usable and check.data_format == "pairs" and not check.fatal_kind
    prepared = [*load_pairs(Path(check.train_file)), *load_pairs(Path(check.eval_file))]
    assert sorted(p["prompt"][0]["content"] for p in prepared) == sorted(r["prompt"][0]["content"] for r in rows)
    first = check.preview[0]
    assert [m["role"] for m in first] == ["user", "chosen", "rejected"]
    assert first[1]["content"] == "A longer answer than the other, 0." and first[2]["content"] == "Wrong 0."
    assert any("length bias" in note for note in check.report["notes"])
