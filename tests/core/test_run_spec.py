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


def test_the_wizards_estimate_is_read_from_its_table() -> None:
    estimate = {"hours": 0.15, "usd": 0.03, "gpu": "rtx3090", "count": 1, "tokens_per_s": 900.0, "peak_gb": 6.2}
    spec = run_spec_from_dict({**spec_data(), "estimate": estimate}, Path("/runs"))
    assert spec.estimate == estimate
    assert run_spec_from_dict(spec_data(), Path("/runs")).estimate is None


@pytest.mark.parametrize(
    ("estimate", "says"),
    [
        ({"usd": 1.0}, r"\[estimate\] hours must be a number of 0 or more"),
        ({"hours": -1}, r"\[estimate\] hours must be a number of 0 or more"),
        ({"hours": 1, "usd": "cheap"}, r"\[estimate\] usd must be a number"),
        ({"hours": 1, "count": 0}, r"\[estimate\] count must be a whole number of GPUs"),
        ({"hours": 1, "gpu": 3}, r"\[estimate\] gpu must be the GPU's name as text"),
        ({"hours": 1, "eta": 3}, r"\[estimate\] does not know eta; remove it"),
    ],
)
def test_an_estimate_table_that_is_not_one_is_a_clear_line(estimate: dict[str, Any], says: str) -> None:
    with pytest.raises(RunSpecError, match=says):
        run_spec_from_dict({**spec_data(), "estimate": estimate}, Path("/runs"))
