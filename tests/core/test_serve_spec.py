"""SPEC.toml's ``[serve]``: serving from the machine after training, read and checked as engine and wizard use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import RunSpecError, ServeSpec, run_spec_from_dict
from desktop.core.runs.states import FLOW, LIVE, RunState
from desktop.core.runs.timeline import upcoming_states


def spec_data(serve: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {
        "model": {"base": "org/model"},
        "data": {"train": "train.jsonl"},
        "training": {"method": "lora", **training},
        "serve": serve,
    }


def test_serving_is_off_unless_asked_and_its_defaults_are_those_written_in_the_run() -> None:
    assert run_spec_from_dict(spec_data({}), Path("/r")).serve is None
    assert run_spec_from_dict(spec_data({"after_training": False, "idle_minutes": 5}), Path("/r")).serve is None
    serve = run_spec_from_dict(spec_data({"after_training": True}), Path("/r")).serve
    assert serve == ServeSpec() and serve.to_dict() == {
        "name": "tuned", "idle_minutes": 30.0, "local_port": 0, "context": 4096, "backend": "auto",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("serve", "problem"),
    [
        ({"after_training": "yes"}, r"after_training must be true or false"),
        ({"after_training": True, "name": "my model"}, r"name = 'my model': give 1-64 letters"),
        ({"after_training": True, "idle_minutes": 0}, r"idle_minutes = 0: give minutes from 0.05"),
        ({"after_training": True, "idle_minutes": True}, r"idle_minutes = True"),
        ({"after_training": True, "local_port": 80}, r"local_port = 80: give a port from 1024"),
        ({"after_training": True, "context": 64}, r"context = 64"),
        ({"after_training": True, "backend": "tgi"}, r"backend = 'tgi': give one of auto, vllm, llama.cpp"),
        ({"after_training": True, "port": 8000}, r"\[serve\] does not know port; it takes"),
    ],
)
def test_a_serve_section_it_cannot_use_is_one_line_naming_the_key(serve: dict[str, Any], problem: str) -> None:
    with pytest.raises(RunSpecError, match=problem):
        run_spec_from_dict(spec_data(serve), Path("/r"))


def test_serving_needs_an_adapter_and_one_machine() -> None:
    with pytest.raises(RunSpecError, match=r"\[serve\] serves the trained adapter: it needs \[training\] method"):
        run_spec_from_dict(spec_data({"after_training": True}, method="full"), Path("/r"))
    data = spec_data({"after_training": True}) | {"target": {"hosts": ["ssh://u@a:22", "ssh://u@b:22"]}}
    with pytest.raises(RunSpecError, match=r"\[serve\] serves from one machine"):
        run_spec_from_dict(data, Path("/r"))


def test_the_wizards_choice_becomes_the_serve_section() -> None:
    draft = RunDraft(base_model="org/model", train_file="/d/t.jsonl", method="qlora")
    assert "serve" not in draft.spec_dict()
    draft.serve_after_training, draft.serve_idle_minutes = True, 10
    assert draft.spec_dict()["serve"] == {"after_training": True, "idle_minutes": 10.0}


def test_serving_is_live_comes_after_the_pull_and_is_never_announced_ahead() -> None:
    assert FLOW.index(RunState.SERVING) == FLOW.index(RunState.PULLING) + 1 and RunState.SERVING in LIVE
    pulling = [{"to_state": state.value} for state in FLOW[: FLOW.index(RunState.PULLING) + 1]]
    assert upcoming_states(pulling) == [RunState.FINISHED], "a run that does not serve finishes after the pull"
