"""The payload's export after training (``python -m trainer_payload export``): what it refuses, said as its event.

The whole export with real parts (merge, llama.cpp's converter, the files home): tests/runs/test_export_on_machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
