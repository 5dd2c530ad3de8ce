"""TensorBoard on this computer for a run's event files: the local tools' TensorBoard in a child process.

A run with ``[tracking] report_to = ["tensorboard"]`` brings its event files home inside every checkpoint and the
adapter (see :attr:`desktop.services.runs.snapshot.LocalFiles.tensorboard`). The dashboard listens on 127.0.0.1
only, without any secret in its environment, and ends with the app: it runs under the same lifeline as the chat
server (it ends when its stdin closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from desktop.services.local.common import LocalToolError
from desktop.services.local.toolenv import local_python
from desktop.services.platform.secrets import without_secrets
from desktop.services.serving.local_server import HOST, free_port

#: The child's code: TensorBoard's own command line, ended at once when its stdin closes (no dashboard outlives
#: its app, however the app ends).
_LIFELINE = (
    "import os, runpy, sys, threading\n"
    "threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()\n"
    "runpy.run_module('tensorboard.main', run_name='__main__', alter_sys=True)\n"
)


@dataclass
class TensorBoardServer:
    """A running TensorBoard: the event files it shows and where it answers.

    Attributes:
        logdir: The folder of event files.
        port: Its port on 127.0.0.1.
        process: Its process.
        output: Its last lines of output, for the message when it ends.
    """

    logdir: Path
    port: int
    process: asyncio.subprocess.Process
    output: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    _reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The dashboard's address (``http://127.0.0.1:PORT/``)."""
        return f"http://{HOST}:{self.port}/"

    @property
    def running(self) -> bool:
        """Whether the dashboard still runs."""
        return self.process.returncode is None

    async def stop(self, grace_s: float = 5.0) -> None:
        """Ends the dashboard: asked to stop, then killed after ``grace_s``."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        if self._reader is not None:
            await self._reader

    async def _read_output(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        async for raw in stream:
            self.output.append(raw.decode("utf-8", "replace").rstrip())


def tensorboard_command(python: Path, logdir: Path, port: int) -> list[str]:
    """The child's command line: TensorBoard on 127.0.0.1 for ``logdir``, under the lifeline."""
    return [str(python), "-c", _LIFELINE, "--logdir", str(logdir), "--host", HOST, "--port", str(port)]


async def start_tensorboard(logdir: Path, *, ready_timeout_s: float = 60.0) -> TensorBoardServer:
    """Starts TensorBoard for ``logdir`` and returns once it answers.

    Raises:
        LocalToolError: The folder holds no event files, the local tools lack TensorBoard, or it ended or did not
            answer within ``ready_timeout_s`` (its last lines are in the message).
    """
    command = await asyncio.to_thread(_prepare, logdir)
    port = int(command[command.index("--port") + 1])
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,  # the lifeline: open while this process lives
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=without_secrets(),
    )
    server = TensorBoardServer(logdir, port, process)
    server._reader = asyncio.ensure_future(server._read_output())
    try:
        await _until_ready(server, ready_timeout_s)
    except BaseException:
        await server.stop(grace_s=2.0)
        raise
    return server


def _prepare(logdir: Path) -> list[str]:
    """Checks the folder holds event files and picks a port (blocking); returns the command line."""
    if not any(logdir.rglob("events.out.tfevents.*")):
        raise LocalToolError(f"{logdir} holds no TensorBoard event files: train with [tracking] report_to")
    return tensorboard_command(local_python(), logdir.resolve(), free_port())


async def _until_ready(server: TensorBoardServer, timeout_s: float) -> None:
    """Polls the dashboard's list of runs until it answers, it ends, or ``timeout_s`` passes."""
    import httpx  # here, not at import: the window starts without it

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if server.process.returncode is not None:
                await server.stop()
                raise LocalToolError(f"TensorBoard ended before it answered: {_tail(server)}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{server.url}data/runs")).status_code == 200:
                    return
            await asyncio.sleep(0.25)
    raise LocalToolError(f"TensorBoard did not answer within {timeout_s:.0f} s: {_tail(server)}")


def _tail(server: TensorBoardServer) -> str:
    lines = [line.strip() for line in server.output if line.strip()]
    if any("No module named" in line and "tensorboard" in line for line in lines):
        return "the local tools lack TensorBoard: rentune tools install adds it"
    return " | ".join(lines[-3:])[-600:] or "no output"
