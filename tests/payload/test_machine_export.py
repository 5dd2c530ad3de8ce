"""The payload's export after training (``python -m trainer_payload export``): what it refuses, said as its event.

The whole export with real parts (merge, llama.cpp's converter, the files home): tests/runs/test_export_on_machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fixtures.adapters import PATTERN, TrainedAdapter, write_pattern_jsonl
from trainer_payload.export import ExportJobError, read_export_job, run_export
from trainer_payload.protocol import EVENTS_FILE_NAME, EventKind, parse_event_chunk


def _job(tmp_path: Path, export: dict[str, object]) -> tuple[Path, Path]:
    job = tmp_path / "job.json"
    spec = {"base_model": "org/model", "train_file": "t.jsonl", "output_dir": str(tmp_path / "out")}
    job.write_text(json.dumps(spec))
    export_job = tmp_path / "export-job.json"
    export_job.write_text(json.dumps(export))
    return job, export_job


@pytest.mark.parametrize(
    ("export", "problem"),
    [
        ({"merged": True}, "must name the adapter folder"),
        ({"adapter": "../adapter", "merged": True}, ".."),
        ({"adapter": "adapter", "gguf": ["IQ2_XS"], "converters": "/c"}, "GGUF types on the machine are F16, BF16"),
        ({"adapter": "adapter", "gguf": ["Q4_K_M"], "converters": "/c"}, "needs the folder of llama.cpp's source"),
        ({"adapter": "adapter", "gguf": ["Q8_0"]}, "needs the folder of llama.cpp's converters"),
        ({"adapter": "adapter", "judge": {"max_examples": 0, "max_new_tokens": 8}}, "judge needs max_examples"),
        ({"adapter": "adapter", "judge": {"max_examples": 5}}, "judge needs max_examples"),
        ({"adapter": "adapter", "judge": True}, "judge needs max_examples"),
    ],
)
def test_a_job_it_cannot_do_is_refused_in_its_exported_event(
    tmp_path: Path, export: dict[str, object], problem: str
) -> None:
    job, export_job = _job(tmp_path, export)
    assert run_export(job, export_job) == 1
    events = parse_event_chunk((tmp_path / "out" / EVENTS_FILE_NAME).read_bytes()).events
    [ended] = events
    assert ended["event"] is EventKind.EXPORTED and ended["files"] == {} and problem in str(ended.get("error"))


def test_a_job_it_can_do_is_read_as_written(tmp_path: Path) -> None:
    _, export_job = _job(tmp_path, {"adapter": "adapter", "merged": True, "gguf": ["Q8_0"], "converters": "/c"})
    assert read_export_job(export_job)["gguf"] == ["Q8_0"]
    with pytest.raises(ExportJobError):
        read_export_job(_job(tmp_path, {"adapter": "adapter", "gguf": "Q8_0", "converters": "/c"})[1])


def test_a_machine_without_a_compiler_says_what_to_ask_for_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer_payload import export
    from trainer_payload.protocol import EventWriter, JobSpec

    job, _ = _job(tmp_path, {})
    monkeypatch.setattr(export.shutil, "which", lambda _name: None)
    machine = export.MachineExport(
        JobSpec.load(job), {"build_sources": str(tmp_path / "src")}, EventWriter(tmp_path / "e")
    )
    with pytest.raises(RuntimeError, match=r"no cmake or C\+\+ compiler .* ask for gguf:Q8_0 on the machine"):
        machine._quantize_tool()


def _pattern_job(tmp_path: Path, adapter: TrainedAdapter, eval_file: str | None) -> tuple[Path, Path]:
    """A trained job's folder as the machine has it: the adapter under ``out/``, the held-out rows under ``data/``."""
    out = tmp_path / "out"
    shutil.copytree(adapter.path, out / "adapter")
    job, export_job = tmp_path / "job.json", tmp_path / "export-job.json"
    spec = {"base_model": str(adapter.base), "train_file": "t.jsonl", "output_dir": str(out), "eval_file": eval_file}
    job.write_text(json.dumps(spec))
    export_job.write_text(json.dumps({"adapter": "adapter", "judge": {"max_examples": 3, "max_new_tokens": 32}}))
    return job, export_job


@pytest.mark.slow
def test_judging_alone_answers_the_held_out_rows_with_both_models_and_merges_nothing(
    pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    eval_file = write_pattern_jsonl(tmp_path / "data" / "eval.jsonl")
    job, export_job = _pattern_job(tmp_path, pattern_adapter, str(eval_file))
    assert run_export(job, export_job) == 0
    events = parse_event_chunk((tmp_path / "out" / EVENTS_FILE_NAME).read_bytes()).events
    ended = events[-1]
    assert ended["event"] is EventKind.EXPORTED and ended.get("error") is None
    assert ended.get("outputs") == {"judge": "export/judge.json"} and list(ended["files"]) == ["export/judge.json"]
    assert ended.get("notes") == [] and ended.get("merge_check") is None, "nothing merged"
    answers = json.loads((tmp_path / "out" / "export" / "judge.json").read_text())
    assert answers["usable_rows"] == len(PATTERN) and [e["line"] for e in answers["examples"]] == [1, 2, 3]
    assert [e["tuned_answer"] for e in answers["examples"]] == [a for _, a in PATTERN[:3]]
    assert all(e["base_answer"] != e["reference"] for e in answers["examples"])
    assert answers["tuned_loss"] < answers["base_loss"]
    phases = [str(e.get("phase")) for e in events if e["event"] is EventKind.EXPORT]
    assert "judging: example 3 of 3" in phases and not any(p.startswith("merging") for p in phases)


def test_judging_without_held_out_rows_is_a_note_not_a_failure(pattern_adapter: TrainedAdapter, tmp_path: Path) -> None:
    job, export_job = _pattern_job(tmp_path, pattern_adapter, None)
    assert run_export(job, export_job) == 0
    ended = parse_event_chunk((tmp_path / "out" / EVENTS_FILE_NAME).read_bytes()).events[-1]
    assert ended.get("files") == {} and ended.get("outputs") == {}
    assert ended.get("notes") == [
        "judging was asked for, and the run has no held-out rows on the machine: judge it at home"
    ]
