"""Preference pairs as the payload reads them, the job keys of a preference run, and how the terminal shows its
rewards: each shape people give is read as TRL's, and each planted defect is named with its line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from desktop.core.runs.spec import RunSpecError, run_spec_from_dict
from desktop.services.runs.events import describe_event
from trainer_payload.failures import DataError
from trainer_payload.preferences import load_pairs
from trainer_payload.protocol import JobSpec, JobSpecError

USER = [{"role": "user", "content": "Which is right?"}]
GOOD = [{"role": "assistant", "content": "This one."}]
BAD = [{"role": "assistant", "content": "That one."}]


def pairs_of(tmp_path: Path, *rows: object) -> list[dict[str, object]]:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return load_pairs(path)


def test_each_shape_becomes_trls_prompt_chosen_rejected(tmp_path: Path) -> None:
    expected = {"prompt": USER, "chosen": GOOD, "rejected": BAD}
    assert pairs_of(tmp_path, {"prompt": USER, "chosen": GOOD, "rejected": BAD}) == [expected]
    assert pairs_of(tmp_path, {"chosen": USER + GOOD, "rejected": USER + BAD}) == [expected], "prompt implied"
    repeated = {"prompt": USER, "chosen": USER + GOOD, "rejected": USER + BAD}  # answers repeat the prompt
    assert pairs_of(tmp_path, repeated) == [expected]
    ultrafeedback = {"prompt": "Which is right?", "chosen": USER + GOOD, "rejected": USER + BAD}  # its binarised rows
    assert pairs_of(tmp_path, ultrafeedback) == [expected]
    plain = {"prompt": "Which?", "chosen": "This one.", "rejected": "That one."}
    assert pairs_of(tmp_path, plain) == [plain]


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"prompt": USER, "chosen": GOOD}, "the rejected side is missing"),
        ({"prompt": "Which?"}, "the chosen and rejected side is missing"),
        (
            {"prompt": USER, "chosen": GOOD, "rejected": [{"role": "assistant", "content": "  "}]},
            "rejected answer is empty",
        ),
        ({"prompt": "Which?", "chosen": "", "rejected": "That one."}, "the chosen answer is empty"),
        (
            {"chosen": USER + GOOD, "rejected": [{"role": "user", "content": "Other?"}, *BAD]},
            "differ before their answers",
        ),
        ({"chosen": GOOD, "rejected": BAD}, "needs the prompt before its answer"),
        ({"prompt": USER, "chosen": USER, "rejected": BAD}, "'chosen' must end with the assistant's answer"),
        ({"prompt": USER, "chosen": [{"role": "robot", "content": "x"}], "rejected": BAD}, "needs a role"),
        ({"prompt": 3, "chosen": "a", "rejected": "b"}, "'prompt' must be text"),
        (["not", "an", "object"], "expected an object"),
    ],
)
def test_a_pair_that_cannot_train_is_named_with_its_line(tmp_path: Path, row: object, words: str) -> None:
    good = {"prompt": USER, "chosen": GOOD, "rejected": BAD}
    with pytest.raises(DataError, match=rf"pairs\.jsonl:2: .*{words}"):
        pairs_of(tmp_path, good, row)


def test_pairs_in_two_forms_and_an_empty_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r":2: this pair is plain text while the first is chat messages"):
        pairs_of(tmp_path, {"prompt": USER, "chosen": GOOD, "rejected": BAD}, {"chosen": "a", "rejected": "b"})
    with pytest.raises(DataError, match="holds no pairs"):
        pairs_of(tmp_path)


JOB = {"base_model": "m", "train_file": "t", "output_dir": "o"}


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"objective": "rlhf"}, "objective"),
        ({"objective": "dpo", "loss_type": "kto"}, "loss_type"),
        ({"objective": "dpo", "beta": 0.0}, "beta 0.0 must be above 0"),
        ({"objective": "dpo", "engine": "unsloth"}, 'objective "dpo" trains with TRL'),
    ],
)
def test_a_preference_job_with_a_bad_key_is_refused_by_name(keys: dict[str, object], words: str) -> None:
    with pytest.raises(JobSpecError, match=words):
        JobSpec.from_dict({**JOB, **keys})
    assert JobSpec.from_dict({**JOB, "objective": "orpo", "beta": 0.2}).objective == "orpo"


def test_a_spec_judging_on_the_machine_a_preference_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pairs.jsonl").write_text("{}\n")
    text = '[model]\nbase = "m"\n[data]\ntrain = "pairs.jsonl"\neval = "pairs.jsonl"\n[training]\nmethod = "lora"\n'
    text += 'objective = "dpo"\n[judge]\non_machine = true\n[target]\nssh = "ssh://u@h"\n'
    with pytest.raises(RunSpecError, match=r'preference run \(objective "dpo"\) holds pairs out instead; remove'):
        run_spec_from_dict(tomllib.loads(text), tmp_path)


def test_the_terminal_shows_how_often_the_chosen_answer_wins() -> None:
    step = {"event": "step", "step": 7, "loss": 0.5123, "reward_accuracy": 0.75, "reward_margin": 0.31}
    assert describe_event(step) == "step 7: loss 0.5123, chosen preferred 75%, margin +0.310"
    held_out = {"event": "eval", "step": 10, "eval_loss": 0.54, "reward_accuracy": 1.0, "reward_margin": 0.3}
    assert describe_event(held_out) == "held-out loss 0.5400 at step 10, chosen preferred 100%, margin +0.300"
    assert describe_event({"event": "eval", "step": 10, "eval_loss": 1.25}) == "held-out loss 1.2500 at step 10"


def test_a_trial_of_a_preference_run_says_trials_try_chats_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from desktop.cli import main

    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": USER, "chosen": GOOD, "rejected": BAD}) + "\n")
    spec = tmp_path / "SPEC.toml"
    spec.write_text('[model]\nbase = "m"\n[data]\ntrain = "pairs.jsonl"\n[training]\nobjective = "dpo"\n')
    assert main(["trial", str(spec), "--on", "cpu"]) != 0
    said = capsys.readouterr().err
    assert 'tries chat fine-tunes (objective "sft"); this spec\'s objective is "dpo"' in said, said
