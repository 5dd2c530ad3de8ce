"""Measure, then fit: the payload measures its first steps, and an out-of-memory in them is met on the machine.

The CPU has no memory limit to hit, so the payload's test hook (RENTUNE_TEST_MEMORY_LIMIT_BYTES) raises torch's own
OutOfMemoryError at a step whose estimated activations pass a set number of bytes: micro-batch x sequence length x
hidden size x 4 bytes, for each of the tiny model's 2 layers without activation checkpointing, for one with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

from tests.payload.conftest import JobFactory, events_of, payload_env
from trainer_payload import train
from trainer_payload.fit import TEST_LIMIT_ENV, Calibration, forget_failure, smaller_setup
from trainer_payload.protocol import EVENTS_FILE_NAME, EventKind, EventWriter, JobSpec

# micro-batch 4 without checkpointing needs 262,144 bytes, 2 needs 131,072, 1 needs 65,536, 1 with it 32,768
FITS_AT_ONE_WITH_CHECKPOINTING = 40_000
NOTHING_FITS = 20_000


def run_limited(job: Path, limit: int) -> int:
    import subprocess
    import sys

    env = payload_env() | {TEST_LIMIT_ENV: str(limit)}
    command = [sys.executable, "-m", "trainer_payload", "run", str(job)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode


@pytest.mark.slow
def test_an_out_of_memory_in_the_first_steps_halves_the_micro_batch_until_the_job_fits(make_job: JobFactory) -> None:
    job = make_job(
        max_steps=0, epochs=1.0, micro_batch=4, grad_accum=1, gradient_checkpointing=False, calibration_steps=3
    )
    assert run_limited(job, FITS_AT_ONE_WITH_CHECKPOINTING) == 0
    events = events_of(job)
    fits = [e for e in events if e["event"] is EventKind.FIT]
    setups = [(e["micro_batch"], e["grad_accum"], e["gradient_checkpointing"]) for e in fits]
    assert setups == [(2, 2, False), (1, 4, False), (1, 4, True)]  # the effective batch stays 4
    assert all("out of memory" in e["reason"] for e in fits) and [e["attempt"] for e in fits] == [2, 3, 4]
    calibration = next(e for e in events if e["event"] is EventKind.CALIBRATION)
    assert (calibration["micro_batch"], calibration["grad_accum"], calibration["seq_len"]) == (1, 4, 128)
    assert calibration["steps"] == 3 and calibration["seconds_per_step"] > 0 and calibration["tokens_per_s"] > 0
    assert calibration["peak_allocated_gb"] is None  # no GPU here
    done = next(e for e in events if e["event"] is EventKind.DONE)
    assert done["metrics"]["steps"] == 64 // 4, "the same optimizer steps as the job as asked: 64 rows, 4 per update"
    assert sum(1 for e in events if e["event"] is EventKind.CALIBRATION) == 1


@pytest.mark.slow
def test_an_out_of_memory_at_micro_batch_one_with_checkpointing_fails_saying_so(make_job: JobFactory) -> None:
    job = make_job(micro_batch=2, grad_accum=2, max_steps=8, calibration_steps=3)
    assert run_limited(job, NOTHING_FITS) == 1
    events = events_of(job)
    assert [(e["micro_batch"], e["grad_accum"]) for e in events if e["event"] is EventKind.FIT] == [(1, 4)]
    error = next(e for e in events if e["event"] is EventKind.ERROR)
    assert error["kind"] == "oom"
    assert "out of memory at micro-batch 1 with activation checkpointing on" in error["message"]
    assert "sequence length 128" in error["message"]
    assert events[-1]["event"] is EventKind.STATE and events[-1]["state"] == "failed"


@pytest.mark.slow
def test_each_smaller_attempt_loads_only_once_the_failed_attempts_model_is_gone(
    make_job: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real fit loop in this process, every model it loads watched through a weak reference.

    The test limit raises torch's OutOfMemoryError from a step callback whose arguments hold the model and the
    optimizer, as the frames of a real out-of-memory do: the failed trainer, model, optimizer and the error's frames
    must all be gone before the smaller attempt loads, so at each load no model is alive and after it exactly one.
    """
    job = make_job(max_steps=2, micro_batch=4, grad_accum=1, gradient_checkpointing=False, checkpoint_steps=0)
    monkeypatch.setenv(TEST_LIMIT_ENV, str(FITS_AT_ONE_WITH_CHECKPOINTING))
    monkeypatch.setitem(sys.modules, "bitsandbytes", sys.modules.get("bitsandbytes"))  # the run may leave it out
    loaded: weakref.WeakSet[Any] = weakref.WeakSet()
    alive_at_each_load: list[tuple[int, int]] = []
    load = train._load_model

    def load_watched(spec: JobSpec, bf16: bool) -> Any:
        before = len(loaded)
        model = load(spec, bf16)
        loaded.add(model)
        alive_at_each_load.append((before, len(loaded)))
        return model

    monkeypatch.setattr(train, "_load_model", load_watched)
    spec = JobSpec.load(job)
    events = EventWriter(Path(spec.output_dir) / EVENTS_FILE_NAME)
    assert train.PayloadRun(spec, events, train.Stop()).execute() == train.EXIT_DONE
    assert [e["micro_batch"] for e in events_of(job) if e["event"] is EventKind.FIT] == [2, 1, 1]
    assert alive_at_each_load == [(0, 1)] * 4, "(models alive before, after) each load: a failed one was kept"


def test_a_forgotten_failure_keeps_nothing_of_its_frames_even_while_the_error_is_kept() -> None:
    class Model:
        """Stands for the failed attempt's model."""

    loaded: weakref.WeakSet[Model] = weakref.WeakSet()

    def step(model: Model, optimizer: list[Model]) -> None:
        raise RuntimeError("CUDA out of memory (in the step)")

    def attempt() -> None:
        model = Model()
        loaded.add(model)
        try:
            step(model, [model])
        except RuntimeError as exc:
            raise ValueError("the trainer wrapped it") from exc

    try:
        attempt()
    except ValueError:
        kept = sys.exc_info()  # a log record keeps an error and its traceback alive in the same way
    error = kept[1]
    cause = error.__cause__ if error else None
    assert error is not None and cause is not None
    assert len(loaded) == 1, "the error's frames hold the model"
    forget_failure(error)
    assert len(loaded) == 0, "the frames of the error and of the one it was raised from are cleared"
    assert error.__traceback__ is None and cause.__traceback__ is None
    assert str(cause) == "CUDA out of memory (in the step)", "the error itself stays whole"


def test_the_fit_keeps_the_effective_batch_and_ends_at_one_with_checkpointing() -> None:
    spec = JobSpec(base_model="m", train_file="t", output_dir="o", micro_batch=6, grad_accum=2)
    spec = dataclasses.replace(spec, gradient_checkpointing=False)
    seen = []
    while (spec := smaller_setup(spec)) is not None:
        seen.append((spec.micro_batch, spec.grad_accum, spec.gradient_checkpointing))
    assert seen == [(3, 4, False), (1, 12, False), (1, 12, True)]
    assert all(mb * ga == 12 for mb, ga, _ in seen)


def test_the_calibration_measures_once_after_its_steps_or_its_minutes() -> None:
    calibration = Calibration(steps=3, minutes=2.0)
    assert calibration.on_log(1, 100.0, now=10.0) is None  # the first logged step is the baseline
    assert calibration.on_log(3, 300.0, now=12.0) is None
    measured = calibration.on_log(4, 400.0, now=13.0)
    assert measured is not None and measured["steps"] == 3 and measured["seconds_per_step"] == 1.0
    assert measured["tokens_per_s"] == 100.0 and calibration.done
    assert calibration.on_log(5, 500.0, now=14.0) is None  # once
    slow = Calibration(steps=20, minutes=2.0)
    slow.on_log(1, 0.0, now=0.0)
    assert slow.on_log(2, 50.0, now=60.0) is None
    assert slow.on_log(3, 100.0, now=121.0) is not None  # two minutes passed before twenty steps


def test_the_calibration_keys_are_checked_as_the_other_job_keys() -> None:
    from trainer_payload.protocol import JobSpecError

    base = {"base_model": "m", "train_file": "t", "output_dir": "o"}
    assert JobSpec.from_dict(base).calibration_steps == 20
    with pytest.raises(JobSpecError, match="calibration_steps"):
        JobSpec.from_dict(base | {"calibration_steps": -1})
    with pytest.raises(JobSpecError, match="calibration_minutes"):
        JobSpec.from_dict(base | {"calibration_minutes": -2.0})
    assert json.loads(json.dumps(JobSpec.from_dict(base).to_dict()))["calibration_minutes"] == 2.0
    assert os.environ.get(TEST_LIMIT_ENV) is None  # the hook is off unless a test sets it
