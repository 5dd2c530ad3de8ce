"""SPEC.toml's ``[judge]``: judging base against tuned on the machine before it goes, read and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import JudgeSpec, RunSpecError, run_spec_from_dict


def spec_data(judge: dict[str, Any], *, held_out: bool = True, method: str = "lora") -> dict[str, Any]:
    data = {"train": "train.jsonl", **({"eval": "eval.jsonl"} if held_out else {})}
    return {"model": {"base": "org/model"}, "data": data, "training": {"method": method}, "judge": judge}


def test_judging_on_the_machine_is_off_unless_asked_and_its_defaults_are_what_the_machine_gets() -> None:
    assert run_spec_from_dict(spec_data({}), Path("/r")).judge is None
    assert run_spec_from_dict(spec_data({"on_machine": False, "max_examples": 5}), Path("/r")).judge is None
    judge = run_spec_from_dict(spec_data({"on_machine": True}), Path("/r")).judge
    assert judge == JudgeSpec() and judge.to_dict() == {"max_examples": 50, "max_new_tokens": 128}
    asked = run_spec_from_dict(spec_data({"on_machine": True, "max_examples": 8, "max_new_tokens": 32}), Path("/r"))
    assert asked.judge == JudgeSpec(8, 32)


@pytest.mark.parametrize(
    ("judge", "problem"),
    [
        ({"on_machine": "yes"}, r"\[judge\] on_machine must be true or false"),
        ({"on_machine": 1}, r"\[judge\] on_machine must be true or false"),
        ({"on_machine": True, "max_examples": 0}, r"max_examples = 0: give a whole number from 1 to 10000"),
        ({"on_machine": True, "max_new_tokens": 12.5}, r"max_new_tokens = 12.5: give a whole number"),
        ({"on_machine": True, "max_examples": True}, r"max_examples = True"),
        ({"on_machine": True, "rows": 8}, r"\[judge\] does not know rows; it takes max_examples, max_new_tokens"),
    ],
)
def test_a_judge_section_it_cannot_use_is_one_line_naming_the_key(judge: dict[str, Any], problem: str) -> None:
    with pytest.raises(RunSpecError, match=problem):
        run_spec_from_dict(spec_data(judge), Path("/r"))


def test_judging_needs_held_out_rows_and_an_adapter() -> None:
    with pytest.raises(RunSpecError, match=r"\[judge\] on_machine judges the held-out rows: give \[data\] eval"):
        run_spec_from_dict(spec_data({"on_machine": True}, held_out=False), Path("/r"))
    with pytest.raises(RunSpecError, match=r"it needs \[training\] method qlora or lora"):
        run_spec_from_dict(spec_data({"on_machine": True}, method="full"), Path("/r"))


def test_the_wizards_choice_becomes_the_judge_section_only_with_held_out_rows() -> None:
    draft = RunDraft(base_model="org/model", train_file="/d/t.jsonl", method="qlora", judge_on_machine=True)
    assert "judge" not in draft.spec_dict(), "no held-out rows: nothing to judge"
    draft.eval_file = "/d/eval.jsonl"
    assert draft.spec_dict()["judge"] == {"on_machine": True}
