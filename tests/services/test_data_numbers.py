"""One answer to the data's numbers: the prepared manifest, read back as DataNumbers, recounted when the model, the
sequence length, the columns or the secrets choice change, and the sizing made with exactly those tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from desktop.core.runs.draft import RunDraft
from desktop.services.data.numbers import read_data_numbers
from desktop.services.data.prepare import manifest_tokens, prepare_dataset, read_manifest
from desktop.services.data.tokens import load_token_counter
from desktop.services.data.workspace import prepare_for_draft
from desktop.services.runs.draft_facts import draft_facts
from tests.fixtures.tiny_models import TinyModel

BAD = Path(__file__).parents[1] / "data" / "bad"


def conversations(train_file: str) -> list[list[dict[str, str]]]:
    return [json.loads(line)["messages"] for line in Path(train_file).read_text(encoding="utf-8").splitlines()]


def test_the_manifest_names_rows_left_out_apart_from_the_errors_they_hold(tmp_path: Path) -> None:
    source = tmp_path / "mixed.jsonl"
    row_with_two = {"messages": [{"role": "bot", "content": "x"}, {"role": "user", "content": "y"}]}
    source.write_text((BAD / "mixed.jsonl").read_text(encoding="utf-8") + json.dumps(row_with_two) + "\n")
    prepared = prepare_dataset(source, tmp_path / "out", eval_fraction=0)
    numbers = read_data_numbers(str(prepared.train))
    assert numbers is not None
    manifest = prepared.manifest_data
    assert numbers.rows_with_errors == manifest["counts"]["with_errors"]
    assert numbers.error_problems == prepared.report.errors > numbers.rows_with_errors
    assert numbers.train_examples == len(conversations(str(prepared.train))) and numbers.eval_examples == 0
    assert not numbers.exact and numbers.model == "" and numbers.data_format == "messages"


def test_rows_with_a_suspected_secret_are_left_out_when_asked(tmp_path: Path) -> None:
    source = shutil.copy(BAD / "secret.jsonl", tmp_path / "secret.jsonl")
    kept = prepare_dataset(Path(source), tmp_path / "kept", eval_fraction=0)
    dropped = prepare_dataset(Path(source), tmp_path / "dropped", eval_fraction=0, leave_out_secrets=True)
    assert any("hf_" in json.dumps(c) for c in conversations(str(kept.train)))
    assert not any("hf_" in json.dumps(c) for c in conversations(str(dropped.train)))
    before, after = read_data_numbers(str(kept.train)), read_data_numbers(str(dropped.train))
    assert before is not None and after is not None
    assert (before.secret_rows, before.secrets_left_out) == (1, False)
    assert (after.secret_rows, after.secrets_left_out) == (1, True)
    assert after.kept == before.kept - 1 and after.train_tokens < before.train_tokens


def test_the_training_tokens_are_the_training_files_own(tmp_path: Path, chat_dataset: Path) -> None:
    prepared = prepare_dataset(chat_dataset, tmp_path / "out", seq_len=2048, eval_fraction=0.1)
    numbers = read_data_numbers(str(prepared.train))
    assert numbers is not None and numbers.eval_examples > 0
    counter = load_token_counter(None)
    expected = sum(min(2048, n) for n in counter.count(conversations(str(prepared.train))))
    assert numbers.train_tokens == expected
    counted = manifest_tokens(prepared.manifest_data)
    assert counted is not None and counted[0] == expected
    assert counted[1].endswith("estimated at about 4 characters per token") and "(" not in counted[1]


def test_a_chosen_model_recounts_the_data_with_its_tokenizer(chat_dataset: Path, tiny_model: TinyModel) -> None:
    draft = RunDraft(data_file=str(chat_dataset))
    first = prepare_for_draft(draft)
    assert first is not None and first.numbers is not None and not first.numbers.exact
    draft.train_file = first.train_file
    assert prepare_for_draft(draft) == first, "the same settings: the remembered check, nothing recounted"
    draft.base_model = str(tiny_model.path)
    second = prepare_for_draft(draft)
    assert second is not None and second.numbers is not None
    numbers = second.numbers
    assert numbers.exact and numbers.model == str(tiny_model.path) and numbers.estimate_reason == ""
    counter = load_token_counter(str(tiny_model.path))
    seq_len = numbers.seq_len
    assert numbers.train_tokens == sum(min(seq_len, n) for n in counter.count(conversations(second.train_file)))
    assert numbers.train_tokens != first.numbers.train_tokens
    assert numbers.matches(model=str(tiny_model.path), seq_len=seq_len, leave_out_secrets=False)
    assert not numbers.matches(model="", seq_len=seq_len, leave_out_secrets=False)
    assert read_data_numbers(second.train_file) == numbers, "the manifest on disk says the same"


def test_draft_facts_sizes_with_the_numbers_it_shows(chat_dataset: Path, tiny_model: TinyModel) -> None:
    draft = RunDraft(data_file=str(chat_dataset), base_model=str(tiny_model.path), method="lora")
    draft.training["seq_len"] = 256
    facts = draft_facts(draft)
    numbers = facts.numbers
    assert numbers is not None and facts.sizing is not None and facts.sizing_error is None
    assert numbers.exact and numbers.seq_len == 256
    assert facts.sizing.plan.workload.tokens == numbers.train_tokens
    assert facts.sizing.tokens_source == numbers.tokens_source()
    assert draft.train_file == "" and facts.apply(draft) and draft.train_file == numbers.train_file
    assert read_manifest(draft.train_file) is not None
    draft.data_file = str(chat_dataset.with_name("other.jsonl"))
    assert not facts.apply(draft), "facts for another file never re-point the draft"


def test_a_model_that_cannot_be_sized_is_a_headline_what_to_do_and_the_setting() -> None:
    facts = draft_facts(RunDraft(base_model="some-org/some-model-not-cached"))
    error = facts.sizing_error
    assert facts.sizing is None and error is not None
    assert error.headline == "The Hugging Face Hub cannot be reached" and error.setting == "base_model"
    assert "offline" in error.details and "Error" not in error.details


def test_a_tokenizer_that_cannot_be_loaded_is_explained_without_its_exception() -> None:
    counter = load_token_counter("not a model id at all")
    assert not counter.exact and counter.model == "not a model id at all"
    assert "Error" not in counter.reason and "(" not in counter.reason
