"""SPEC.toml's [budget] is checked as it is read, and the wizard's draft carries its GPU pick into the spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.draft import RunDraft, TargetDraft, gpu_pick_label, gpu_pick_training
from desktop.core.runs.spec import RunSpecError, run_spec_from_dict
from trainer_payload.protocol import JobSpec


def spec_data(**budget: Any) -> dict[str, Any]:
    return {"model": {"base": "org/model"}, "data": {"train": "train.jsonl"}, "budget": budget}


def test_a_budget_with_an_hourly_rate_is_read() -> None:
    spec = run_spec_from_dict(spec_data(max_usd=5, hourly_rate_usd=2.0), Path("/runs"))
    assert (spec.budget_usd, spec.hourly_rate_usd) == (5.0, 2.0)


def test_a_budget_without_an_hourly_rate_is_refused_naming_both_keys() -> None:
    with pytest.raises(RunSpecError, match=r"\[budget\] max_usd .* needs \[budget\] hourly_rate_usd"):
        run_spec_from_dict(spec_data(max_usd=5), Path("/runs"))


@pytest.mark.parametrize(("key", "value"), [("max_usd", "five"), ("max_usd", -1), ("hourly_rate_usd", True)])
def test_money_that_is_not_a_positive_number_is_one_clear_line(key: str, value: object) -> None:
    with pytest.raises(RunSpecError, match=rf"\[budget\] {key} = .* must be a number of dollars"):
        run_spec_from_dict(spec_data(**{"hourly_rate_usd": 1.0, key: value}), Path("/runs"))


def draft(gpu_name: str) -> RunDraft:
    target = TargetDraft(host="gpu-box", user="me")
    return RunDraft(base_model="org/model", train_file="/data/train.jsonl", gpu_name=gpu_name, target=target)


@pytest.mark.parametrize(
    ("label", "num_gpus", "strategy"),
    [
        (gpu_pick_label("H100 SXM", 1, "ddp"), 1, "ddp"),
        (gpu_pick_label("H100 SXM", 2, "fsdp"), 2, "fsdp"),
        (gpu_pick_label("RTX A6000", 4, "ddp"), 4, "ddp"),
        ("2 x A100 80GB", 2, "ddp"),  # a draft saved before the label named the strategy
    ],
)
def test_the_sizing_pick_sets_the_gpu_count_of_the_spec_and_the_job(label: str, num_gpus: int, strategy: str) -> None:
    spec = run_spec_from_dict(draft(label).spec_dict(), Path("/runs"))
    assert spec.training["num_gpus"] == num_gpus
    job = JobSpec.from_dict(spec.job_dict("data/train.jsonl", None))
    assert (job.num_gpus, job.strategy) == (num_gpus, strategy)


def test_no_pick_leaves_the_gpu_count_to_the_training_keys() -> None:
    assert gpu_pick_training("") == {}
    assert "num_gpus" not in run_spec_from_dict(draft("").spec_dict(), Path("/runs")).training
