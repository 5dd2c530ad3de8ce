"""The tiny models are real transformers models: they load, tokenize through the chat template, generate and learn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.chat_data import chat_rows
from tests.fixtures.tiny_models import TinyModel


@pytest.mark.parametrize("fixture_name", ["tiny_model", "tiny_qwen2_model"])
def test_autotokenizer_keeps_the_trained_ids(fixture_name: str, request: pytest.FixtureRequest) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    model: TinyModel = request.getfixturevalue(fixture_name)
    loaded = AutoTokenizer.from_pretrained(model.path)
    raw = Tokenizer.from_file(str(model.path / "raw_tokenizer.json"))
    text = "<|im_start|>user\nWhat is two plus  three?\n\nHéllo wörld 123<|im_end|>"
    assert loaded.encode(text) == raw.encode(text).ids
    assert len(loaded) == model.vocab_size


def test_chat_template_marks_only_assistant_tokens(tiny_model: TinyModel) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model.path)
    messages = next(chat_rows(1))["messages"]
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    mask = encoded["assistant_masks"]
    assistant_ids = [t for t, m in zip(encoded["input_ids"], mask, strict=True) if m]
    assert tokenizer.decode(assistant_ids) == messages[2]["content"] + "<|im_end|>"


@pytest.mark.parametrize("fixture_name", ["tiny_model", "tiny_qwen2_model"])
def test_tiny_model_generates(fixture_name: str, request: pytest.FixtureRequest) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_info: TinyModel = request.getfixturevalue(fixture_name)
    tokenizer = AutoTokenizer.from_pretrained(model_info.path)
    model = AutoModelForCausalLM.from_pretrained(model_info.path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is one plus two?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    torch.manual_seed(0)
    out = model.generate(**prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    new_tokens = out[0, prompt["input_ids"].shape[1] :]
    assert len(new_tokens) == 6
    assert isinstance(tokenizer.decode(new_tokens), str)
    assert json.loads((model_info.path / "config.json").read_text())["model_type"] == model_info.kind


def test_a_few_dozen_steps_visibly_lower_the_loss(tiny_model: TinyModel, chat_dataset: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model.path)
    rows = [json.loads(line)["messages"] for line in chat_dataset.read_text().splitlines()]
    batch = tokenizer.apply_chat_template(rows, tokenize=True, padding=True, return_tensors="pt", return_dict=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model.path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5, losses
