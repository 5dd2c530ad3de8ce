"""SPEC.toml's [compute] (a machine to rent) is checked as it is read, each problem named with its key and fix."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.spec import ComputeSpec, RunSpecError, compute_from_dict, run_spec_from_dict

EXAMPLE = Path(__file__).parents[2] / "resources" / "examples" / "RENTED.toml"


def spec_data(compute: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": {"base": "org/model"}, "data": {"train": "train.jsonl"}, "compute": compute, **extra}


def test_the_example_rents_a_4090_on_runpod_with_a_budget_and_no_rate() -> None:
    spec = run_spec_from_dict(tomllib.loads(EXAMPLE.read_text()), EXAMPLE.parent)
    assert spec.target is None and spec.compute is not None
    assert (spec.compute.provider, spec.compute.gpu, spec.compute.max_price_per_hour) == ("runpod", "RTX 4090", 1.0)
    assert spec.budget_usd == 10.0, "a rented machine's price is known: no hourly rate needed"


def test_defaults_and_the_providers_a_run_may_move_to() -> None:
    compute = compute_from_dict({"provider": "Vast.ai", "providers": ["runpod", "vast"]})
    assert compute == ComputeSpec(provider="vast", providers=("runpod", "vast"))
    assert compute.allowed_providers == ("vast", "runpod")
    assert (compute.count, compute.spot, compute.ready_timeout_minutes, compute.idle_minutes) == (1, False, 10.0, 20.0)


@pytest.mark.parametrize(
    ("compute", "words"),
    [
        ({}, r"\[compute\] provider is required"),
        ({"provider": "aws"}, r"provider = 'aws': use one of runpod, vast, lambda"),
        ({"provider": "runpod", "gpus": 2}, r"does not know gpus; it takes"),
        ({"provider": "runpod", "count": 1.5}, r"count = 1.5 must be a whole number above 0"),
        ({"provider": "runpod", "spot": "yes"}, r"spot = 'yes' must be true or false"),
        ({"provider": "runpod", "max_price_per_hour": -1}, r"max_price_per_hour = -1 must be a number above 0"),
        ({"provider": "runpod", "ready_timeout_minutes": 0}, r"ready_timeout_minutes = 0 must be a number above 0"),
        ({"provider": "runpod", "idle_minutes": "never"}, r"idle_minutes = 'never' must be a number of minutes"),
        ({"provider": "runpod", "providers": "vast"}, r"providers must be a list"),
        ({"provider": "lambda", "self_stop_minutes": 30}, r"on Lambda needs send_api_key = true"),
    ],
)
def test_a_bad_compute_table_is_one_clear_line(compute: dict[str, Any], words: str) -> None:
    with pytest.raises(RunSpecError, match=words):
        run_spec_from_dict(spec_data(compute), Path("/runs"))


def test_target_and_compute_together_are_refused() -> None:
    data = spec_data({"provider": "runpod"}, target={"ssh": "ssh://u@h:22"})
    with pytest.raises(RunSpecError, match=r"either \[target\] .* or \[compute\]"):
        run_spec_from_dict(data, Path("/runs"))
