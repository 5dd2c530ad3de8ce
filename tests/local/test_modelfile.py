"""Ollama Modelfiles from real chat templates: the TEMPLATE renders what the Jinja template renders."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from desktop.services.local.common import LocalToolError
from desktop.services.local.modelfile import ChatPieces, chat_pieces, modelfile_text, write_modelfile
from tests.fixtures.real_tokenizers import ensure_real_tokenizers
from tests.fixtures.smollm2 import SmolLM2
from tests.fixtures.tiny_models import TinyModel

CONVERSATION = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "General Kenobi."},
    {"role": "user", "content": "How are you?"},
]


def _as_the_go_template_renders(pieces: ChatPieces, system: str | None, messages: list[dict[str, str]]) -> str:
    """What the TEMPLATE of :func:`go_template` renders for a system prompt and the messages (its logic, in Python)."""
    text = f"{pieces.head_system}{system}{pieces.system_to_user}" if system else pieces.head_user
    for message in messages:
        joiner = pieces.user_to_answer if message["role"] == "user" else pieces.answer_to_user
        text += message["content"] + joiner
    return text


def _template_literals(modelfile: str) -> list[str]:
    template = modelfile.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    return [json.loads(literal) for literal in re.findall(r'\{\{ ("(?:[^"\\]|\\.)*") \}\}', template)]


def _check_renders_like_jinja(tokenizer: Any) -> ChatPieces:
    pieces = chat_pieces(tokenizer)
    for system in ("You are terse.", None):
        messages = ([{"role": "system", "content": system}] if system else []) + CONVERSATION
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if tokenizer.bos_token and _adds_bos(tokenizer):
            expected = expected.removeprefix(tokenizer.bos_token)
        assert _as_the_go_template_renders(pieces, system, CONVERSATION) == expected
    return pieces


def _adds_bos(tokenizer: Any) -> bool:
    return bool(tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id])


async def test_chatml_modelfile(tiny_model: TinyModel, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    _check_renders_like_jinja(AutoTokenizer.from_pretrained(tiny_model.path))
    out = await write_modelfile(tmp_path / "model.gguf", tiny_model.path, tmp_path / "Modelfile")
    text = out.read_text()
    assert text.startswith("FROM ./model.gguf\n")
    assert "ADAPTER" not in text
    assert 'PARAMETER stop "<|im_end|>"' in text
    assert "<|im_start|>assistant\n" in _template_literals(text)[-2]


async def test_smollm2_modelfile_keeps_its_default_system_prompt(smollm2: SmolLM2, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    pieces = _check_renders_like_jinja(AutoTokenizer.from_pretrained(smollm2.hf))
    assert "You are a helpful AI assistant named SmolLM" in pieces.head_user
    adapter = tmp_path / "adapters" / "lora.gguf"
    out = await write_modelfile(tmp_path / "model.gguf", smollm2.hf, tmp_path / "Modelfile", adapter_gguf=adapter)
    text = out.read_text()
    assert f"ADAPTER {adapter.resolve()}\n" in text  # not beside the Modelfile: an absolute path
    assert pieces.head_user in _template_literals(text)
    assert text.count("PARAMETER stop") == 1  # <|im_end|> is both the end of a turn and EOS


def test_llama3_modelfile() -> None:
    tokens = ensure_real_tokenizers()
    tokenizer = tokens.tokenizer("llama3", tokens.template("meta-llama-Llama-3.1-8B-Instruct.jinja"))
    pieces = _check_renders_like_jinja(tokenizer)
    assert pieces.user_to_answer == "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    text = modelfile_text(tokenizer, Path("/models/llama.gguf"), Path("/elsewhere/Modelfile"))
    assert text.startswith("FROM /models/llama.gguf\n")
    assert 'PARAMETER stop "<|eot_id|>"' in text
    assert 'PARAMETER stop "<|end_of_text|>"' in text
    assert set(_template_literals(text)) == {
        pieces.head_system,
        pieces.system_to_user,
        pieces.head_user,
        pieces.user_to_answer,
        pieces.answer_to_user,
    }


def test_a_tokenizer_without_chat_template_is_refused() -> None:
    tokenizer = ensure_real_tokenizers().tokenizer("llama3")
    tokenizer.chat_template = None
    with pytest.raises(LocalToolError, match="no chat template"):
        chat_pieces(tokenizer)


async def test_an_unreadable_tokenizer_folder(tmp_path: Path) -> None:
    with pytest.raises(LocalToolError, match="cannot load the tokenizer"):
        await write_modelfile(tmp_path / "m.gguf", tmp_path, tmp_path / "Modelfile")
    assert not (tmp_path / "Modelfile").exists()
