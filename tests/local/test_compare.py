"""The base-vs-tuned comparison on the tiny Llama and its pattern adapter: answers, losses, report, bad inputs."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from desktop.services.evaluation.judge import JudgeOptions, judge_comparison
from desktop.services.evaluation.report import html_report, markdown_report, write_reports
from desktop.services.local.common import LocalToolError
from desktop.services.local.compare import CompareExample, CompareResult, compare_adapter, read_eval_rows
from tests.fixtures.adapters import PATTERN, TrainedAdapter, write_pattern_jsonl
from tests.fixtures.tiny_models import TinyModel, build_tiny_model


def _compare(adapter: TrainedAdapter, eval_file: Path, base: Path | None = None, **options: object) -> CompareResult:
    return asyncio.run(compare_adapter(base or adapter.base, adapter.path, eval_file, **options))  # type: ignore[arg-type]


def test_the_tuned_model_answers_the_pattern_and_has_the_lower_loss(
    pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    reports: list[tuple[str, float | None]] = []
    result = _compare(
        pattern_adapter, write_pattern_jsonl(tmp_path / "eval.jsonl"), progress=lambda t, f: reports.append((t, f))
    )
    assert [e.prompt for e in result.examples] == [q for q, _ in PATTERN]
    assert [e.reference for e in result.examples] == [a for _, a in PATTERN]
    assert [e.tuned_answer for e in result.examples] == [a for _, a in PATTERN]
    assert all(e.base_answer != e.reference for e in result.examples)
    assert result.tuned_loss < result.base_loss - 0.5
    assert not result.cut
    assert [t for t, _ in reports if t.startswith("example")] == [f"example {i} of 4" for i in range(1, 5)]
    assert reports[-1] == ("compared 4 examples", 1.0)

    written = write_reports(judge_comparison(result, JudgeOptions(), None, None), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.json", "report.md"]
    for text in (written["markdown"].read_text(encoding="utf-8"), written["html"].read_text(encoding="utf-8")):
        assert f"{result.base_loss:.4f}" in text and f"{result.tuned_loss:.4f}" in text
        assert "lower is better" in text
        for question, answer in PATTERN:
            assert question in text and answer in text


def test_rows_past_the_limit_are_left_out_and_the_report_says_so(
    pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    result = _compare(pattern_adapter, write_pattern_jsonl(tmp_path / "eval.jsonl"), max_examples=2, max_new_tokens=8)
    assert len(result.examples) == 2 and result.usable_rows == 4 and result.cut
    assert "cut to the first 2 rows" in markdown_report(judge_comparison(result, JudgeOptions(), None, None))


def test_the_last_assistant_turn_is_the_reference_and_bad_rows_are_skipped(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "no answer here"}]},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Goodbye"},
            ]
        },
    ]
    path = tmp_path / "eval.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    read, usable = read_eval_rows(path, 50)
    assert usable == 1 and [line for line, _ in read] == [2]


def test_an_eval_file_without_usable_rows_names_the_first_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "eval.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "only a question"}]}\n', encoding="utf-8")
    with pytest.raises(LocalToolError, match="no assistant turn, line 1; add the answer"):
        read_eval_rows(path, 50)


def test_user_text_is_shown_verbatim_in_both_reports(tmp_path: Path) -> None:
    tricky = "```\n# not a heading\n</pre><script>alert(1)</script> **bold** `tick`"
    example = CompareExample(tricky, "ref", "base", "tuned", 1)
    result = CompareResult(tmp_path / "b", tmp_path / "a", tmp_path / "e.jsonl", 2.0, 1.0, [example], 1)
    judgement = judge_comparison(result, JudgeOptions(), None, None)
    markdown = markdown_report(judgement)
    fence = "````text"  # longer than the text's own ``` run, so the text cannot close it
    assert f"{fence}\n{tricky}\n````" in markdown
    page = html_report(judgement)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_an_adapter_for_another_base_is_refused(
    pattern_adapter: TrainedAdapter, tiny_qwen2_model: TinyModel, tmp_path: Path
) -> None:
    with pytest.raises(LocalToolError, match=r"trained on another base model.*pass the --base it was trained on"):
        _compare(pattern_adapter, write_pattern_jsonl(tmp_path / "eval.jsonl"), base=tiny_qwen2_model.path)


def test_a_corrupt_adapter_is_refused(pattern_adapter: TrainedAdapter, tmp_path: Path) -> None:
    broken = tmp_path / "adapter"
    shutil.copytree(pattern_adapter.path, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"\x00" * 100)
    damaged = TrainedAdapter(broken, pattern_adapter.base, pattern_adapter.pattern)
    with pytest.raises(LocalToolError, match=r"adapter_model\.safetensors is damaged"):
        _compare(damaged, write_pattern_jsonl(tmp_path / "eval.jsonl"))


def test_cancelling_kills_the_comparison_child_at_once(
    pattern_adapter: TrainedAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    seen: list[str] = []
    children: list[asyncio.subprocess.Process] = []
    start_child = asyncio.create_subprocess_exec

    async def recorded(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        children.append(await start_child(*args, **kwargs))
        return children[-1]

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recorded)

    async def cancel_at_first_example() -> None:
        started = asyncio.Event()

        def progress(text: str, _fraction: float | None) -> None:
            seen.append(text)
            if text.startswith("example"):
                started.set()

        task = asyncio.create_task(
            compare_adapter(pattern_adapter.base, pattern_adapter.path, eval_file, progress=progress)
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_at_first_example())
    assert "compared 4 examples" not in seen
    assert [child.returncode for child in children] == [-signal.SIGKILL]  # killed, and waited for


def test_an_adapter_whose_weights_do_not_fit_the_base_is_refused(
    pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    narrow = build_tiny_model(tmp_path / "narrow-llama", "llama", hidden=32)
    adapter = tmp_path / "adapter"
    shutil.copytree(pattern_adapter.path, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = "someone/tiny-llama"  # a Hub id: nothing to compare configs with first
    (adapter / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    moved = TrainedAdapter(adapter, narrow.path, pattern_adapter.pattern)
    with pytest.raises(
        LocalToolError, match=r"trained on another base model: .*the base weight is \[32, 64\].*pass the --base"
    ):
        _compare(moved, write_pattern_jsonl(tmp_path / "eval.jsonl"))
