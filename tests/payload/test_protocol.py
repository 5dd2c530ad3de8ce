from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_payload.protocol import EventKind, EventWriter, JobSpec, JobSpecError, read_events

BASE = {"base_model": "org/model", "train_file": "data/train.jsonl", "output_dir": "out"}


def test_fixed_keys_and_defaults() -> None:
    spec = JobSpec.from_dict(BASE)
    keys = set(spec.to_dict())
    for key in (
        "version",
        "base_model",
        "train_file",
        "eval_file",
        "method",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "target_modules",
        "seq_len",
        "micro_batch",
        "grad_accum",
        "epochs",
        "max_steps",
        "learning_rate",
        "seed",
        "checkpoint_steps",
        "checkpoint_minutes",
        "keep_checkpoints",
        "output_dir",
        "engine",
        "num_gpus",
        "strategy",
    ):
        assert key in keys
    assert (spec.method, spec.lora_r, spec.lora_alpha, spec.seq_len) == ("qlora", 16, 32, 2048)


def test_relative_paths_resolve_against_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(json.dumps(BASE))
    spec = JobSpec.load(tmp_path / "job.json")
    assert spec.train_file == str(tmp_path / "data" / "train.jsonl")
    assert spec.output_dir == str(tmp_path / "out")
    assert spec.base_model == "org/model", "Hub ids are not paths"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"method": "dora"}, "method 'dora'"),
        ({"lora_r": 0}, "lora_r 0"),
        ({"seq_len": "long"}, "seq_len"),
        ({"learning_rate": 5}, "learning_rate"),
        ({"bogus": 1}, "unknown job keys: bogus"),
        ({"version": 9}, "version 9"),
        ({"epochs": 0, "max_steps": -1}, "max_steps"),
        ({"target_modules": 3}, "target_modules"),
        ({"train_file": ""}, "missing job keys: train_file"),
    ],
)
def test_invalid_specs_name_the_key(change: dict[str, object], message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        JobSpec.from_dict(BASE | change)


def test_events_continue_their_sequence_and_tail_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    EventWriter(path).emit(EventKind.STATE, state="training")
    second = EventWriter(path)  # a restarted payload continues the numbering
    second.emit(EventKind.STEP, step=1, loss=2.0)
    first_read, offset = read_events(path, 0)
    assert [e["seq"] for e in first_read] == [1, 2]
    with path.open("ab") as handle:
        handle.write(b'{"ts": 1, "seq": 3, "event": "step", "st')  # a line still being written
    more, offset2 = read_events(path, offset)
    assert more == [] and offset2 == offset
    with path.open("ab") as handle:
        handle.write(b'ep": 2}\n')
    more, _ = read_events(path, offset2)
    assert [e["seq"] for e in more] == [3]


def test_error_events_carry_their_own_kind(tmp_path: Path) -> None:
    event = EventWriter(tmp_path / "e.jsonl").emit(EventKind.ERROR, kind="oom", message="m", hint="h")
    assert (event["event"], event["kind"]) == ("error", "oom")
