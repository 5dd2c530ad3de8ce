"""Training defaults and ranges have one source: the payload's job spec (the contract both sides share)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from desktop.core.runs.draft import DEFAULT_TRAINING
from desktop.core.sizing.setup import DEFAULT_SETUP, SETTING_RANGES, SetupError, TrainingSetup
from trainer_payload.protocol import JOB_INT_RANGES, JobSpec, JobSpecError, job_default


def test_sizing_and_the_wizard_start_from_the_payloads_defaults() -> None:
    for key in ("lora_r", "lora_dropout", "seq_len", "micro_batch", "grad_accum", "num_gpus"):
        assert getattr(DEFAULT_SETUP, key) == job_default(key)
    assert DEFAULT_SETUP.grad_ckpt == job_default("gradient_checkpointing")
    assert DEFAULT_SETUP.method == job_default("method") and DEFAULT_SETUP.strategy == job_default("strategy")
    assert DEFAULT_SETUP.targets == job_default("target_modules")
    assert all(value == job_default(key) for key, value in DEFAULT_TRAINING.items())
    with pytest.raises(KeyError):
        job_default("base_model")  # required: it has no default


@pytest.mark.parametrize("setting", sorted(SETTING_RANGES))
def test_what_sizing_accepts_the_payload_accepts_and_no_more(setting: str) -> None:
    low, high = SETTING_RANGES[setting]
    assert (low, high) == JOB_INT_RANGES[setting]
    job = {"base_model": "m", "train_file": "t.jsonl", "output_dir": "out", "head_address": "10.65.0.2"}
    for value in (low, high):
        TrainingSetup(**{setting: value})
        JobSpec(**job, **{setting: value}).validate()
    for value in (low - 1, high + 1):
        with pytest.raises(SetupError) as refused:
            TrainingSetup(**{setting: value})
        assert refused.value.setting == setting and "--" not in str(refused.value)
        with pytest.raises(JobSpecError):
            JobSpec(**job, **{setting: value}).validate()
    assert setting in {f.name for f in fields(TrainingSetup)}
