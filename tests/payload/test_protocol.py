from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_payload.protocol import EventKind, EventWriter, JobSpec, JobSpecError, parse_event_chunk, read_event_file

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
    first_read = read_event_file(path, 0)
    offset = first_read.offset
    assert [e["seq"] for e in first_read.events] == [1, 2]
    with path.open("ab") as handle:
        handle.write(b'{"ts": 1760000000, "seq": 3, "event": "step", "st')  # a line still being written
    more = read_event_file(path, offset)
    assert more.events == [] and more.offset == offset
    with path.open("ab") as handle:
        handle.write(b'ep": 2, "loss": 1.5}\n')
    assert [e["seq"] for e in read_event_file(path, offset).events] == [3]


def test_error_events_carry_their_own_kind(tmp_path: Path) -> None:
    event = EventWriter(tmp_path / "e.jsonl").emit(EventKind.ERROR, kind="oom", message="m", hint="h")
    assert (event["event"], event["kind"]) == ("error", "oom")


def test_null_optional_keys_take_their_defaults() -> None:
    nulls = {"checkpoint_minutes": None, "epochs": None, "eval_file": None, "extra": None, "target_modules": None}
    spec = JobSpec.from_dict(BASE | nulls)
    defaults = JobSpec.from_dict(BASE)
    assert spec == defaults and spec.checkpoint_minutes == 30.0 and spec.epochs == 3.0


def test_a_null_required_key_is_missing() -> None:
    with pytest.raises(JobSpecError, match="missing job keys: base_model"):
        JobSpec.from_dict(BASE | {"base_model": None})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lora_r": "16"}, 'lora_r must be a whole number, not "16"'),
        ({"learning_rate": "fast"}, 'learning_rate must be a number, not "fast"'),
        ({"checkpoint_minutes": "30"}, "checkpoint_minutes must be a number"),
        ({"epochs": True}, "epochs must be a number, not true"),
        ({"gradient_checkpointing": "yes"}, "gradient_checkpointing must be true or false"),
        ({"target_modules": ["q_proj", 3]}, "target_modules must be text or a list of text"),
        ({"eval_file": 7}, "eval_file must be text or null"),
        ({"extra": []}, "extra must be an object"),
        ({"base_model": 5}, "base_model must be text"),
        ({"seed": 1.5}, "seed must be a whole number, not 1.5"),
    ],
)
def test_a_wrong_type_names_the_key_and_the_type(change: dict[str, object], message: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict(BASE | change)
    assert str(caught.value).startswith(message)


def test_whole_numbers_are_accepted_for_float_keys() -> None:
    spec = JobSpec.from_dict(BASE | {"epochs": 2, "learning_rate": 1e-4, "checkpoint_minutes": 5})
    assert (spec.epochs, spec.checkpoint_minutes) == (2.0, 5.0) and isinstance(spec.epochs, float)


def test_payload_run_with_a_wrong_type_is_a_config_error_and_exit_2_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(json.dumps(BASE | {"learning_rate": "fast"}))
    result = subprocess.run(
        [sys.executable, "-m", "trainer_payload", "run", str(tmp_path / "job.json")],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    error = read_event_file(tmp_path / "out" / "events.jsonl").events[0]
    assert (error["event"], error["kind"]) == ("error", "config")
    assert "learning_rate" in error["message"]


TORN = b'{"ts": 1760000000.0, "seq": 3, "event": "step", "st'


def test_an_event_after_a_torn_line_starts_on_a_line_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path)
    writer.emit(EventKind.STATE, state="training")
    writer.emit(EventKind.STEP, step=1, loss=2.0)
    with path.open("ab") as handle:
        handle.write(TORN)  # the payload died in the middle of this write
    EventWriter(path).emit(EventKind.STEP, step=2, loss=1.5)
    tail = read_event_file(path)
    events, offset = tail.events, tail.offset
    assert [(e["seq"], e.get("step")) for e in events] == [(1, None), (2, 1), (3, 2)], "contiguous, nothing glued"
    assert offset == path.stat().st_size
    EventWriter(path).emit(EventKind.STEP, step=3, loss=1.2)
    assert path.read_bytes().count(b"\n\n") == 0, "a file that ends a line gets no extra newline"


def test_malformed_lines_are_skipped_by_writers_and_readers(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    EventWriter(path).emit(EventKind.STATE, state="training")
    with path.open("ab") as handle:
        handle.write(TORN + b"\n" + b"not json\n" + b"[1, 2]\n" + b'{"seq": "x", "event": "step"}\n' + b"\xff\xfe\n")
    event = EventWriter(path).emit(EventKind.STEP, step=1, loss=2.0)
    assert event["seq"] == 2
    data = path.read_bytes()
    chunk = parse_event_chunk(data)
    assert [e["seq"] for e in chunk.events] == [1, 2] and chunk.used == len(data)


def _strict(text: str) -> object:
    """Reads JSON as strict parsers do: ``NaN`` and ``Infinity`` are no JSON."""

    def refuse(word: str) -> object:
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_writer_writes_numbers_that_are_not_finite_as_null(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path)
    nan, inf = float("nan"), float("inf")
    written = writer.emit(EventKind.STEP, step=1, loss=2.0, lr=nan, gpu={"temps": (inf, 40.0)}, tokens_per_s=-inf)
    assert written["lr"] is None and written["gpu"] == {"temps": [None, 40.0]} and written["tokens_per_s"] is None
    writer.emit(EventKind.STEP, step=2, loss=nan)  # a diverged step: its required loss cannot be written
    writer.emit(EventKind.EVAL, step=2, eval_loss=1.5)
    writer.emit(EventKind.DONE, adapter_path="adapter", files={}, metrics={"final_loss": nan, "steps": 2})
    lines = path.read_text().splitlines()
    assert all(_strict(line) for line in lines), "every line is strict JSON"
    chunk = parse_event_chunk(path.read_bytes())
    assert [e["seq"] for e in chunk.events] == [1, 3, 4], "the step without a loss is skipped by readers"
    assert len(chunk.skipped) == 1 and "step field 'loss' must be int or float, not null" in chunk.skipped[0]
    assert chunk.events[0].get("lr") is None and chunk.events[-1].get("metrics") == {"final_loss": None, "steps": 2}
    assert EventWriter(path).emit(EventKind.STATE, state="done")["seq"] == 5, "the sequence goes on after it"
