"""``rentune serve`` for real: llama.cpp's server on loopback, spoken to with the official ``openai`` client.

The model is the tiny Llama taught the pattern, exported to GGUF Q8_0 (the chain of tests/local/test_gguf.py, built
once per test run): the server must give the taught answer with the model's own chat template, stream the same
text, cut at a stop sequence, and count the requests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from desktop.services.local.common import LocalToolError
from desktop.services.serving.local_server import LocalServer, free_port, start_server
from tests.local.test_gguf import Chain, chain  # noqa: F401 - the fixture, imported

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def _counted(server: LocalServer, count: int) -> int:
    """The server's request count once it reached ``count`` (its access log line follows the answer), or after 10 s."""
    deadline = time.monotonic() + 10
    while server.requests < count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return server.requests


async def test_the_openai_client_gets_the_taught_answer_streamed_and_cut_at_a_stop(chain: Chain) -> None:  # noqa: F811
    from openai import AsyncOpenAI

    question, answer = chain.adapter.pattern[0]
    server = await start_server(chain.q8.path)
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/v1")
        async with AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0) as client:
            messages = [{"role": "user", "content": question}]
            reply = await client.chat.completions.create(model="tuned", messages=messages, temperature=0, max_tokens=24)  # type: ignore[arg-type]
            text = str(reply.choices[0].message.content)
            assert text.strip() == answer, "the taught answer, through the model's own chat template"
            assert reply.choices[0].finish_reason == "stop", "the end-of-turn token ends it"

            stream = await client.chat.completions.create(
                model="tuned",
                messages=messages,
                temperature=0,
                max_tokens=24,
                stream=True,  # type: ignore[arg-type]
            )
            streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
            assert streamed == text, "streaming gives the same answer"

            stop = answer.split()[1]
            cut = await client.chat.completions.create(
                model="tuned",
                messages=messages,
                temperature=0,
                max_tokens=24,
                stop=[stop],  # type: ignore[arg-type]
            )
            assert str(cut.choices[0].message.content) == text[: text.index(stop)], "cut before the stop sequence"
            listed = [model.id for model in (await client.models.list()).data]
            assert listed == [chain.q8.path.name], "it lists the model it serves by its file's name"
            assert await _counted(server, 3) == 3, "three completions asked, three counted"
        assert "python" in server.examples() and server.url in server.examples()["curl"]
    finally:
        await server.stop()
    assert server.process.returncode is not None


async def test_bad_input_is_named_before_anything_starts(tmp_path: Path, chain: Chain) -> None:  # noqa: F811
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(LocalToolError, match=r"notes\.gguf is not a GGUF file"):
        await start_server(text)
    with pytest.raises(LocalToolError, match="cannot be read"):
        await start_server(tmp_path / "missing.gguf")
    with pytest.raises(LocalToolError, match=r"the LoRA .* is not a GGUF file"):
        await start_server(chain.q8.path, lora=text)
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LocalToolError, match=f"port {port} is in use"):
            await start_server(chain.q8.path, port=port)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_rentune_serve_says_where_it_answers_and_a_stop_ends_the_server_with_the_count(
    chain: Chain,  # noqa: F811
    stop_signal: signal.Signals,
) -> None:
    port = free_port()
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "desktop", "serve", str(chain.q8.path), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # up to the Python example's last line: what the user reads first
            lines.append(line)
            if "print(reply" in line or len(lines) > 50:
                break
        url = f"http://127.0.0.1:{port}/v1"
        assert lines[1].startswith(f"Serving model-q8_0.gguf at {url} "), lines
        assert any(line.strip().startswith(f"curl {url}/chat/completions") for line in lines), lines
        question, answer = chain.adapter.pattern[0]
        body = {"messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": 24}
        reply = httpx.post(f"{url}/chat/completions", json=body, timeout=60).json()
        assert reply["choices"][0]["message"]["content"].strip() == answer
        time.sleep(0.5)  # the server's access log line follows its answer
        process.send_signal(stop_signal)
        rest = process.communicate(timeout=60)[0]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, rest
    assert rest.strip() == "Stopped after 1 request."
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)


def test_a_server_whose_command_is_killed_outright_ends_with_it(chain: Chain) -> None:  # noqa: F811
    """SIGKILL leaves no handler a chance: the server's lifeline (its stdin, closed by the system) ends it."""
    port = free_port()
    command = [sys.executable, "-m", "desktop", "serve", str(chain.q8.path), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("Serving"):
                break
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
        process.kill()
        process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
        except httpx.HTTPError:
            break
        time.sleep(0.2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
