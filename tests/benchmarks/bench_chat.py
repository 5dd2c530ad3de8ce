"""Chat speed: rentune's chat service against llama-cpp-python called directly on the same GGUF (load excluded).

Both answer the same prompt greedily with the same settings, streamed, interleaved run by run; the answer is the
same text, so tokens per second compare like for like. The model is SmolLM2-135M-Instruct (Q4_1).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from desktop.services.local.chat import ChatModel, generation_threads, open_chat
from tests.benchmarks.common import Row, print_table
from tests.fixtures.smollm2 import ensure_smollm2

MESSAGES = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]
MAX_TOKENS = 160
RUNS = 5
TARGET_RATIO = 0.95


def stream_directly(llama: Any) -> tuple[int, float]:
    """Pieces streamed and seconds taken by llama-cpp-python alone."""
    start = time.perf_counter()
    pieces = 0
    for chunk in llama.create_chat_completion(messages=MESSAGES, stream=True, temperature=0, max_tokens=MAX_TOKENS):
        if chunk["choices"][0]["delta"].get("content"):
            pieces += 1
    return pieces, time.perf_counter() - start


async def _ours(model: ChatModel) -> tuple[int, float]:
    start = time.perf_counter()
    pieces = 0
    async for _piece in model.stream(MESSAGES, temperature=0, max_tokens=MAX_TOKENS):
        pieces += 1
    return pieces, time.perf_counter() - start


async def _measure(gguf: Path) -> tuple[float, float]:
    from llama_cpp import Llama

    threads = generation_threads()
    llama = Llama(model_path=str(gguf), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    model = await open_chat(gguf)
    ours: list[float] = []
    direct: list[float] = []
    try:
        for _ in range(RUNS):
            pieces, seconds = await _ours(model)
            ours.append(pieces / seconds)
            pieces, seconds = stream_directly(llama)
            direct.append(pieces / seconds)
    finally:
        await model.close()
        llama.close()
    return statistics.median(ours), statistics.median(direct)


def run() -> bool:
    ours, direct = asyncio.run(_measure(ensure_smollm2().gguf))
    threads = f"{generation_threads()} threads of {os.cpu_count()} cores (one left for the app)"
    print(f"median of {RUNS} interleaved greedy answers of up to {MAX_TOKENS} tokens, {threads}")
    return print_table(
        [
            Row(
                "chat tokens/s, SmolLM2 Q4_1 (llama.cpp)",
                ours,
                direct,
                "t",
                f">= {TARGET_RATIO}x direct",
                ours >= TARGET_RATIO * direct,
            )
        ]
    )
