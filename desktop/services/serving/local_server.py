"""An OpenAI-compatible server on this computer for a GGUF: llama-cpp-python's own server, in a child process.

The server answers ``/v1/chat/completions`` (streaming too), ``/v1/completions`` and ``/v1/models`` with the model's
own chat template and end-of-turn token (the GGUF carries both), on 127.0.0.1 only. It runs with the local tools'
Python and without any secret in its environment. Its requests are counted from the access log it writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from desktop.services.local.chat import generation_threads
from desktop.services.local.common import LocalToolError
from desktop.services.local.toolenv import local_python
from desktop.services.platform.secrets import without_secrets

#: The host the server listens on: this computer only.
HOST = "127.0.0.1"
#: The context window the server gives the model unless told otherwise.
DEFAULT_CONTEXT = 4096


def lifeline(module: str) -> str:
    """The child's code: ``python -m MODULE``, ended at once when its stdin closes.

    The app keeps that pipe open and never writes to it, so whatever way the app ends (even killed), the system
    closes the pipe and the server goes with it: no server outlives its app.
    """
    return (
        "import os, runpy, sys, threading\n"
        "threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )


async def start_child(command: list[str]) -> asyncio.subprocess.Process:
    """Starts a server's child under its lifeline (stdin held open), output piped, without any secret in its env."""
    return await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,  # the lifeline: open while this process lives
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=without_secrets(),
    )


async def read_lines(process: asyncio.subprocess.Process, on_line: Callable[[str], None]) -> None:
    """Hands each line the child prints to ``on_line`` until it ends."""
    assert process.stdout is not None
    async for raw in process.stdout:
        on_line(raw.decode("utf-8", "replace").rstrip())


async def stop_child(process: asyncio.subprocess.Process, reader: asyncio.Task[None] | None, grace_s: float) -> None:
    """Ends a child: asked to stop, then killed after ``grace_s``; waits for its output to be read to the end."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if reader is not None:
        await reader


@dataclass(frozen=True)
class Readiness:
    """How to tell a starting server answers: the address to ask, for how long, and how it is named.

    Attributes:
        url: Asked until it answers 200.
        timeout_s: How long to wait for it.
        what: The server as a message names it ("the server", "TensorBoard").
        tail: Its last lines of output, in words (why it ended or hangs).
    """

    url: str
    timeout_s: float
    what: str
    tail: Callable[[], str]


async def poll_until_ready(
    process: asyncio.subprocess.Process, reader: asyncio.Task[None] | None, ready: Readiness
) -> None:
    """Polls ``ready.url`` until it answers 200, the child ends, or the time is up.

    Raises:
        LocalToolError: The child ended (its output read to the end first) or did not answer in time; its last
            lines say why.
    """
    import httpx  # here, not at import: the window starts without it

    deadline = time.monotonic() + ready.timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                if reader is not None:
                    await reader
                raise LocalToolError(f"{ready.what} ended before it answered: {ready.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(ready.url)).status_code == 200:
                    return
            await asyncio.sleep(0.25)
    raise LocalToolError(f"{ready.what} did not answer within {ready.timeout_s:.0f} s: {ready.tail()}")


#: A request the access log names: ``"POST /v1/chat/completions HTTP/1.1" 200``.
_REQUEST = re.compile(r'"POST /v1/(?:chat/completions|completions|embeddings) HTTP/[0-9.]+" (\d{3})')


@dataclass
class LocalServer:
    """A running server: where it answers and how many requests it answered.

    Attributes:
        model: The GGUF it serves.
        port: Its port on 127.0.0.1.
        process: The server's process.
        requests: Completion requests answered so far (any status).
        output: Its last lines of output, for the message when it ends.
    """

    model: Path
    port: int
    process: asyncio.subprocess.Process
    requests: int = 0
    output: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    _reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
        return f"http://{HOST}:{self.port}/v1"

    def examples(self) -> dict[str, str]:
        """A copyable request for curl and one for Python's ``openai`` client."""
        curl = (
            f"curl {self.url}/chat/completions \\\n"
            "  -H 'Content-Type: application/json' \\\n"
            '  -d \'{"messages": [{"role": "user", "content": "Hello"}]}\''
        )
        python = (
            "from openai import OpenAI\n"
            f'client = OpenAI(base_url="{self.url}", api_key="none")\n'
            'messages = [{"role": "user", "content": "Hello"}]\n'
            f'reply = client.chat.completions.create(model="{self.model.name}", messages=messages)\n'
            "print(reply.choices[0].message.content)"
        )
        return {"curl": curl, "python": python}

    async def wait(self) -> int:
        """Waits until the server ends; returns its exit code."""
        code = await self.process.wait()
        if self._reader is not None:
            await self._reader
        return code

    async def stop(self, grace_s: float = 10.0) -> None:
        """Ends the server: asked to stop, then killed after ``grace_s``."""
        await stop_child(self.process, self._reader, grace_s)

    def _on_line(self, line: str) -> None:
        self.output.append(line)
        if _REQUEST.search(line):
            self.requests += 1


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise LocalToolError(f"port {port} is not a port: give one from 1 to 65535, or none to pick a free one")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            raise LocalToolError(f"port {port} is in use: give another, or none to pick a free one") from None


def _check_gguf(path: Path, what: str) -> None:
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise LocalToolError(f"{what} {path} cannot be read ({exc.strerror or exc}): give a .gguf file") from None
    if magic != b"GGUF":
        raise LocalToolError(f"{what} {path} is not a GGUF file: serve a .gguf Rentune exported (rentune export)")


def server_command(python: Path, model: Path, port: int, *, lora: Path | None, context: int) -> list[str]:
    """The child's command line: llama-cpp-python's server on 127.0.0.1 with the model's own chat template.

    It runs under a lifeline: it ends when its stdin closes (see :func:`lifeline`).
    """
    command = [str(python), "-c", lifeline("llama_cpp.server"), "--model", str(model), "--host", HOST]
    command += ["--port", str(port)]
    command += ["--model_alias", model.name]  # clients see the file's name, not where it lies on this computer
    threads = str(generation_threads())  # as the chat: every core but one, so the app stays responsive beside it
    command += ["--n_ctx", str(context), "--n_threads", threads, "--n_threads_batch", threads, "--verbose", "False"]
    return command + (["--lora_path", str(lora)] if lora is not None else [])


async def start_server(
    model: Path,
    *,
    port: int | None = None,
    lora: Path | None = None,
    context: int = DEFAULT_CONTEXT,
    ready_timeout_s: float = 180.0,
) -> LocalServer:
    """Starts the server for ``model`` (with the GGUF LoRA ``lora``) and returns once it answers.

    Raises:
        LocalToolError: The model or LoRA is not a GGUF, the port is taken, the local tools lack the server, or the
            server ended or did not answer within ``ready_timeout_s`` (its last lines are in the message).
    """
    model, chosen, command = await asyncio.to_thread(_prepare, model, port, lora, context)
    server = LocalServer(model, chosen, await start_child(command))
    server._reader = asyncio.ensure_future(read_lines(server.process, server._on_line))
    try:
        ready = Readiness(f"{server.url}/models", ready_timeout_s, "the server", lambda: _tail(server))
        await poll_until_ready(server.process, server._reader, ready)
    except BaseException:
        await server.stop(grace_s=2.0)
        raise
    return server


def _prepare(model: Path, port: int | None, lora: Path | None, context: int) -> tuple[Path, int, list[str]]:
    """Checks the files and the port (blocking); returns the model's full path, the port and the command line."""
    _check_gguf(model, "the model")
    if lora is not None:
        _check_gguf(lora, "the LoRA")
        lora = lora.resolve()
    port = free_port() if port is None else port
    _check_port(port)
    model = model.resolve()
    return model, port, server_command(local_python(), model, port, lora=lora, context=context)


def _tail(server: LocalServer) -> str:
    lines = [line.strip() for line in server.output if line.strip()]
    if any("No module named" in line and "llama_cpp" in line for line in lines) or any(
        "No module named 'fastapi'" in line or "No module named 'uvicorn'" in line for line in lines
    ):
        return "the local tools lack llama-cpp-python's server: rentune tools install adds it"
    return " | ".join(lines[-3:])[-600:] or "no output"
