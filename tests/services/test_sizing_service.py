"""The sizing service on real files: a draft's plan from its prepared data's manifest, and the errors worded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.core.runs.draft import RunDraft
from desktop.core.sizing.setup import Method
from desktop.services.data.prepare import manifest_tokens, prepare_dataset, read_manifest
from desktop.services.models.sizing import (
    DEFAULT_TOKENS,
    SizingError,
    draft_workload,
    option_label,
    server_fit_warning,
    size_run,
    training_setup,
)
from desktop.services.runs.drafts import size_draft


def train_rows(train_file: Path) -> list[list[dict[str, str]]]:
    """The conversations of a prepared training file."""
    return [json.loads(line)["messages"] for line in train_file.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def prepared(chat_dataset: Path, tmp_path: Path) -> Path:
    """The chat dataset prepared as the data step does; the training file's path."""
    return prepare_dataset(chat_dataset, tmp_path / "prepared", seq_len=2048, eval_fraction=0.1).train


def test_a_draft_with_prepared_data_is_sized_with_the_manifests_training_tokens(prepared: Path) -> None:
    manifest = json.loads((prepared.parent / "manifest.json").read_text(encoding="utf-8"))
    counts, trained = manifest["counts"], manifest["tokens"]["trained_per_epoch"]
    # The training file's own examples, each cut to the sequence length: exactly what is trained per epoch.
    expected = sum(
        min(2048, round(sum(len(m["content"]) for m in row) / 4) + 4 * len(row)) for row in train_rows(prepared)
    )
    sizing = size_draft(RunDraft(base_model="qwen2.5-0.5b", train_file=str(prepared)))
    assert sizing.plan.workload.tokens == expected and expected < trained  # the eval share is not trained
    assert sizing.plan.workload.epochs == 3.0
    assert f"{counts['train']:,} training examples of the prepared data" in sizing.tokens_source
    assert sizing.recommended is not None and sizing.option(option_label(sizing.recommended)) is sizing.recommended


def test_without_prepared_data_the_default_token_count_is_assumed(tmp_path: Path) -> None:
    assert read_manifest(str(tmp_path / "nowhere" / "train.jsonl")) is None
    sizing = size_draft(RunDraft(base_model="qwen2.5-0.5b", method="lora"))
    assert sizing.plan.workload.tokens == DEFAULT_TOKENS
    assert "prepare the data for exact counts" in sizing.tokens_source


def test_a_step_limit_sizes_the_steps_not_the_data(prepared: Path) -> None:
    manifest = read_manifest(str(prepared))
    assert manifest is not None
    counted = manifest_tokens(manifest)
    setup = training_setup("lora", {"max_steps": 40, "micro_batch": 2, "grad_accum": 4, "seq_len": 512})
    workload, source = draft_workload({"max_steps": 40}, setup, counted)
    assert workload.tokens == 40 * setup.tokens_per_step and workload.epochs == 1.0
    assert source == "40 steps at most"


def test_an_unreachable_hub_model_says_it_is_offline_and_what_to_do() -> None:
    with pytest.raises(SizingError) as raised:
        size_run(RunDraft(base_model="some-org/some-model-not-cached"), None)
    message = str(raised.value)
    assert "some-org/some-model-not-cached cannot be sized" in message
    assert "offline" in message and "local model folder" in message


def test_no_model_and_out_of_range_settings_name_the_fix() -> None:
    with pytest.raises(SizingError, match="choose a base model on the Model step first"):
        size_run(RunDraft(), None)
    with pytest.raises(SizingError, match=r"sequence length 3 .*fix it on the Model step"):
        training_setup("lora", {"seq_len": 3})
    assert training_setup("qlora", {"target_modules": ["q_proj", "v_proj"]}).method is Method.QLORA


def test_an_own_server_too_small_gets_a_warning_and_a_large_one_none() -> None:
    sizing = size_run(RunDraft(base_model="llama-3.1-8b", method="lora"), None)
    assert "run out of memory" in server_fit_warning("1 x NVIDIA GeForce RTX 3060 (12288 MiB)", sizing)
    assert server_fit_warning("1 x NVIDIA H200 (143771 MiB)", sizing) == ""
    assert "on a CPU only tiny models train" in server_fit_warning("no GPU", sizing)
    assert server_fit_warning("", sizing) == ""
