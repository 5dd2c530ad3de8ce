"""Chats kept per model and written as training data the data step accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.services.data.check import check_dataset
from desktop.services.local.chat import Conversation
from desktop.services.local.chat_history import (
    export_training_jsonl,
    forget_history,
    history_file,
    load_history,
    save_history,
    training_line,
)


def talk() -> Conversation:
    conversation = Conversation("Answer briefly.")
    conversation.record("What is 2+3?", "5.")
    conversation.record("And in words?", "Five, with **bold** and `code`.")
    return conversation


def test_a_chat_is_saved_per_model_and_lora_and_comes_back(tmp_path: Path) -> None:
    model, lora = tmp_path / "model-Q8_0.gguf", tmp_path / "adapter-lora.gguf"
    save_history(model, None, talk())
    assert load_history(model, None) == talk()
    assert load_history(model, lora) is None  # with a LoRA it is another model, with its own chat
    assert history_file(model, lora) != history_file(model, None)
    assert history_file(model).name.startswith("model-Q8_0-")
    forget_history(model)
    assert load_history(model) is None


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"schema_version": 99, "turns": []}),
        json.dumps({"schema_version": 1, "turns": [{"role": "assistant", "content": "first?"}, {"role": "user"}]}),
        json.dumps({"schema_version": 1, "turns": [{"role": "user", "content": "unanswered"}]}),
        json.dumps({"schema_version": 1, "system": 3, "turns": []}),
    ],
)
def test_a_saved_chat_the_app_did_not_write_is_not_loaded(tmp_path: Path, content: str) -> None:
    model = tmp_path / "m.gguf"
    history_file(model).parent.mkdir(parents=True, exist_ok=True)
    history_file(model).write_text(content, encoding="utf-8")
    assert load_history(model) is None


def test_a_chat_becomes_a_line_of_training_data_the_data_check_accepts(tmp_path: Path) -> None:
    target = tmp_path / "good-chats.jsonl"
    second = Conversation()
    second.record("Name a colour.", "Blue.")
    export_training_jsonl(talk(), target)
    export_training_jsonl(second, target)  # a second good chat is added, not written over the first
    lines = target.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    assert [m["role"] for m in json.loads(lines[0])["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    outcome = check_dataset(target)
    assert not outcome.report.fatal and outcome.report.valid == 2 and not outcome.duplicates


def test_a_chat_without_an_answer_is_not_training_data() -> None:
    with pytest.raises(ValueError, match="no answer yet"):
        training_line(Conversation())
