"""``rentune eval`` (and its old name ``compare``): the JSON, a run id resolved to its adapter and eval file, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from desktop.cli.app import main
from desktop.services.runs.store import RunStore
from tests.fixtures.adapters import PATTERN, TrainedAdapter, write_pattern_jsonl
from tests.fixtures.tiny_models import TinyModel

REPORTS = {"markdown": "md", "html": "html", "json": "json"}


def _error(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 2) -> str:
    assert main(argv) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("rentune: error: ")
    return lines[-1]


def test_json_has_the_verdict_the_scores_the_flips_the_rows_and_the_report(
    pattern_adapter: TrainedAdapter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    out = tmp_path / "out"
    argv = ["eval", str(pattern_adapter.path), "--base", str(pattern_adapter.base), "--eval", str(eval_file)]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["tuned_loss"] < printed["base_loss"] - 0.5
    assert printed["deciding_check"] == "normalised" and printed["outcome"] == "no clear difference"
    assert printed["scores"][0] == {"check": "normalised", "base_right": 0, "tuned_right": 4, "rows": 4}
    assert printed["p_value"] == 0.125, "4 fixed, 0 broken: exactly 2 / 2**4"
    assert [(row["prompt"], row["tuned_answer"]) for row in printed["fixed"]] == PATTERN and printed["broke"] == []
    assert [(row["prompt"], row["tuned_answer"]) for row in printed["rows"]] == PATTERN
    assert printed["report"] == {kind: str(out / f"report.{ext}") for kind, ext in REPORTS.items()}
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    assert json.loads((out / "report.json").read_text(encoding="utf-8"))["scores"] == printed["scores"]


def test_a_run_id_brings_its_adapter_base_and_eval_file(
    pattern_adapter: TrainedAdapter,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    eval_file = write_pattern_jsonl(tmp_path / "held-out.jsonl", PATTERN[:2])
    store = RunStore()
    record = store.create({"base_model": str(pattern_adapter.base), "eval_file": str(eval_file)}, None)
    store.update(record.id, adapter=str(pattern_adapter.path))
    monkeypatch.chdir(tmp_path)
    assert main(["compare", record.id]) == 0  # the command's old name
    captured = capsys.readouterr()
    assert "lower is better" in captured.out and "Rows judged: 2 of 2" in captured.out
    assert f"Run {record.id}: fine-tune of {pattern_adapter.base}, trained for" in captured.out
    assert "example 2 of 2" in captured.err
    report = (tmp_path / f"{record.id}-eval" / "report.md").read_text(encoding="utf-8")
    assert str(eval_file) in report and all(q in report for q, _ in PATTERN[:2])


def test_no_eval_file_asks_for_eval(pattern_adapter: TrainedAdapter, capsys: pytest.CaptureFixture[str]) -> None:
    assert "pass --eval FILE" in _error(capsys, ["compare", str(pattern_adapter.path)])


def test_a_missing_eval_file_is_named(
    pattern_adapter: TrainedAdapter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _error(capsys, ["compare", str(pattern_adapter.path), "--eval", str(tmp_path / "nope.jsonl")])
    assert "nope.jsonl does not exist" in line


def test_a_hub_base_that_cannot_be_downloaded_is_named(
    pattern_adapter: TrainedAdapter, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: the Hub is unreachable
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    argv = ["compare", str(pattern_adapter.path), "--base", "someone/some-model", "--eval", str(eval_file)]
    assert "could not download someone/some-model" in _error(capsys, argv, code=1)  # not the input: the network


def test_a_base_that_is_neither_folder_nor_hub_id_asks_for_base(
    pattern_adapter: TrainedAdapter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    argv = ["compare", str(pattern_adapter.path), "--base", "./no/such/model", "--eval", str(eval_file)]
    assert "pass --base MODEL" in _error(capsys, argv)


def test_an_eval_file_without_usable_rows_names_the_line_and_writes_nothing(
    pattern_adapter: TrainedAdapter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text('{"messages": []}\nnot json\n', encoding="utf-8")
    out = tmp_path / "out"
    argv = ["compare", str(pattern_adapter.path), "--eval", str(eval_file), "--out", str(out)]
    assert "no usable chat row; the first problem: wrong field types, line 1: " in _error(capsys, argv)
    assert not out.exists()


def test_an_adapter_for_another_base_writes_nothing(
    pattern_adapter: TrainedAdapter, tiny_qwen2_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    out = tmp_path / "out"
    argv = ["compare", str(pattern_adapter.path), "--base", str(tiny_qwen2_model.path), "--eval", str(eval_file)]
    line = _error(capsys, [*argv, "--out", str(out)])
    assert "this adapter was trained on another base model: " in line
    assert line.endswith("pass the --base it was trained on")
    assert not out.exists()


def test_a_corrupt_adapter_writes_nothing(
    pattern_adapter: TrainedAdapter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "adapter"
    shutil.copytree(pattern_adapter.path, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"{not safetensors")
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    out = tmp_path / "out"
    line = _error(capsys, ["compare", str(broken), "--eval", str(eval_file), "--out", str(out)])
    assert "adapter_model.safetensors is damaged" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--regex", "(unclosed"], "the regular expression '(unclosed' does not compile"),
        (["--json-schema", "missing.json"], "missing.json cannot be read"),
        (["--json-schema", "not-json.json"], "not-json.json is not JSON"),
        (["--json-schema", "bad-schema.json"], "bad-schema.json is not a valid JSON Schema"),
        (["--max-examples", "0"], "--max-examples 0 is not a row count: give 1 or more"),
    ],
    ids=["regex", "no-schema-file", "schema-not-json", "schema-invalid", "no-rows"],
)
def test_bad_checks_are_named_before_any_model_loads(
    pattern_adapter: TrainedAdapter,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not-json.json").write_text("{oops", encoding="utf-8")
    (tmp_path / "bad-schema.json").write_text('{"type": 12}', encoding="utf-8")
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    argv = ["eval", str(pattern_adapter.path), "--base", "./no/such/model", "--eval", str(eval_file), *extra]
    line = _error(capsys, [*argv, "--out", str(tmp_path / "out")])
    assert expected in line, line  # said instead of the missing base: nothing was loaded
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_general_check_runs_the_harness_offline_on_both_models_row_by_row(
    pattern_adapter: TrainedAdapter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    out = tmp_path / "out"
    argv = ["eval", str(pattern_adapter.path), "--base", str(pattern_adapter.base), "--eval", str(eval_file)]
    assert main([*argv, "--general", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "lm-evaluation-harness: rentune_arithmetic, rentune_capitals with the base model" in captured.err
    assert "General ability (lm-evaluation-harness 0.4.13, shipped tasks, offline):" in captured.out
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    tasks = {task["task"]: task for task in report["general"]["tasks"]}
    assert sorted(tasks) == ["rentune_arithmetic", "rentune_capitals"]
    assert (tasks["rentune_arithmetic"]["rows"], tasks["rentune_capitals"]["rows"]) == (60, 68), "every shipped row"
    for task in tasks.values():
        assert task["low"] <= task["difference"] <= task["high"]
        assert task["drift"] in ("regressed", "improved", "no clear change")
    assert "## General ability (lm-evaluation-harness 0.4.13)" in (out / "report.md").read_text(encoding="utf-8")
