"""The chat service on a real GGUF (SmolLM2-135M-Instruct Q4_1) with real llama.cpp: greedy, streamed, stoppable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from desktop.services.local.chat import (
    ChatModel,
    Conversation,
    choose_engine,
    generation_threads,
    gguf_kind,
    open_chat,
)
from desktop.services.local.common import LocalToolError
from tests.fixtures.smollm2 import SmolLM2

QUESTION = [{"role": "user", "content": "Tell me about the sea."}]


def direct_answer(gguf: Path, messages: list[dict[str, str]], max_tokens: int) -> str:
    """llama-cpp-python called directly, greedy, as a user would without Rentune."""
    from llama_cpp import Llama

    threads = generation_threads()
    llama = Llama(model_path=str(gguf), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        reply = llama.create_chat_completion(messages=messages, temperature=0, max_tokens=max_tokens)
        return str(reply["choices"][0]["message"]["content"])  # type: ignore[index]
    finally:
        llama.close()


@pytest.fixture
async def model(smollm2: SmolLM2) -> AsyncIterator[ChatModel]:
    opened = await open_chat(smollm2.gguf)
    yield opened
    await opened.close()


async def test_greedy_answers_are_the_same_every_time_and_match_llama_cpp(model: ChatModel, smollm2: SmolLM2) -> None:
    first = await model.answer(QUESTION, temperature=0, max_tokens=24)
    second = await model.answer(QUESTION, temperature=0, max_tokens=24)

    assert model.engine == "llama.cpp"
    assert first.strip()
    assert first == second == direct_answer(smollm2.gguf, QUESTION, 24)


async def test_streaming_leaves_the_event_loop_free_and_a_dropped_answer_stops(model: ChatModel) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    pieces = [p async for p in model.stream(QUESTION, temperature=0, max_tokens=48)]
    ticker.cancel()
    assert len(pieces) > 5
    assert ticks > len(pieces) // 4  # the loop kept running while tokens were generated

    stream = model.stream(QUESTION, temperature=0, max_tokens=400)
    assert await anext(stream) == pieces[0]
    await stream.aclose()  # the consumer stops: generation stops at the next token
    again = await asyncio.wait_for(model.answer(QUESTION, temperature=0, max_tokens=48), timeout=60)
    assert again == "".join(pieces)


async def test_a_conversation_keeps_history_until_reset(model: ChatModel, smollm2: SmolLM2) -> None:
    conversation = Conversation(system="You are brief.")
    first = await model.answer(conversation.with_question("Hi!"), temperature=0, max_tokens=16)
    conversation.record("Hi!", first)
    messages = conversation.with_question("And you?")

    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert await model.answer(messages, temperature=0, max_tokens=16) == direct_answer(smollm2.gguf, messages, 16)
    conversation.reset()
    assert conversation.with_question("x") == [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "x"},
    ]


def test_gguf_headers_tell_model_from_text(smollm2: SmolLM2, tmp_path: Path) -> None:
    fake = tmp_path / "x.gguf"
    fake.write_text("not a model")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2.gguf.read_bytes()[:40])

    assert gguf_kind(smollm2.gguf) == ("model", "llama")
    with pytest.raises(LocalToolError, match="is not a GGUF file"):
        gguf_kind(fake)
    with pytest.raises(LocalToolError, match="damaged GGUF"):
        gguf_kind(cut)


def test_engine_follows_from_the_model_and_mismatches_are_refused(smollm2: SmolLM2, tmp_path: Path) -> None:
    assert choose_engine(smollm2.gguf, None, None) == "llama.cpp"
    assert choose_engine(smollm2.hf, None, None) == "mlx"
    cases = [
        (tmp_path / "missing.gguf", None, None, "does not exist"),
        (smollm2.gguf, "mlx", None, "needs an MLX model folder"),
        (smollm2.hf, "llama.cpp", None, "llama.cpp needs a .gguf file"),
        (smollm2.gguf, None, smollm2.gguf, "not a GGUF LoRA"),
        (smollm2.gguf, None, tmp_path / "missing-lora.gguf", "does not exist"),
        (smollm2.hf, None, smollm2.gguf, "--lora applies a GGUF LoRA with llama.cpp"),
        (tmp_path, "mlx", None, "has no config.json"),
    ]
    for model, engine, lora, message in cases:
        with pytest.raises(LocalToolError, match=message) as caught:
            choose_engine(model, engine, lora)
        assert "\n" not in str(caught.value)
