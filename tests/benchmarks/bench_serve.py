"""Serve speed: rentune serve's OpenAI-compatible server against llama-cpp-python generating directly (same GGUF).

Both answer the same prompt greedily with the same settings, streamed (the server through its HTTP endpoint with the
official ``openai`` client, as a program would), interleaved run by run, with the same threads; tokens per second
compare like for like. The model is SmolLM2-135M-Instruct (Q4_1). Load and server start are excluded.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from desktop.services.local.chat import generation_threads
from desktop.services.serving.local_server import LocalServer, start_server
from tests.benchmarks.bench_chat import MAX_TOKENS, MESSAGES, RUNS, TARGET_RATIO, stream_directly
from tests.benchmarks.common import Row, print_table
from tests.fixtures.smollm2 import ensure_smollm2


async def _served(client: Any) -> tuple[int, float]:
    start = time.perf_counter()
    pieces = 0
    stream = await client.chat.completions.create(
        model="served", messages=MESSAGES, stream=True, temperature=0, max_tokens=MAX_TOKENS
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
    return pieces, time.perf_counter() - start


async def _measure() -> tuple[float, float]:
    from llama_cpp import Llama
    from openai import AsyncOpenAI

    gguf = ensure_smollm2().gguf
    server: LocalServer = await start_server(gguf)
    threads = generation_threads()
    llama = Llama(model_path=str(gguf), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    served: list[float] = []
    direct: list[float] = []
    try:
        async with AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0) as client:
            for _ in range(RUNS):
                pieces, seconds = await _served(client)
                served.append(pieces / seconds)
                pieces, seconds = stream_directly(
                    llama
                )  # the server idles meanwhile: one answer at a time, as each side
                direct.append(pieces / seconds)
    finally:
        llama.close()
        await server.stop()
    return statistics.median(served), statistics.median(direct)


def run() -> bool:
    served, direct = asyncio.run(_measure())
    print(f"median of {RUNS} interleaved greedy streamed answers of up to {MAX_TOKENS} tokens")
    met = served >= TARGET_RATIO * direct
    row = Row("served tokens/s, SmolLM2 Q4_1", served, direct, "t", f">= {TARGET_RATIO}x direct", met)
    return print_table([row])
