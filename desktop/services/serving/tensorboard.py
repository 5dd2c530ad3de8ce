"""TensorBoard on this computer for a run's event files: the local tools' TensorBoard in a child process.

A run with ``[tracking] report_to = ["tensorboard"]`` brings its event files home inside every checkpoint and the
adapter (see :attr:`desktop.services.runs.snapshot.LocalFiles.tensorboard`). The dashboard listens on 127.0.0.1
only, without any secret in its environment, and ends with the app: it runs under the same lifeline as the chat
server (see :func:`~desktop.services.serving.local_server.lifeline`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from desktop.services.local.common import LocalToolError
from desktop.services.local.toolenv import local_python
from desktop.services.serving.local_server import (
    HOST,
    Readiness,
    free_port,
    lifeline,
    poll_until_ready,
    read_lines,
    start_child,
    stop_child,
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
        await stop_child(self.process, self._reader, grace_s)


def tensorboard_command(python: Path, logdir: Path, port: int) -> list[str]:
    """The child's command line: TensorBoard on 127.0.0.1 for ``logdir``, under the lifeline."""
    return [
        str(python),
        "-c",
        lifeline("tensorboard.main"),
        "--logdir",
        str(logdir),
        "--host",
        HOST,
        "--port",
        str(port),
    ]


async def start_tensorboard(logdir: Path, *, ready_timeout_s: float = 60.0) -> TensorBoardServer:
    """Starts TensorBoard for ``logdir`` and returns once it answers.

    Raises:
        LocalToolError: The folder holds no event files, the local tools lack TensorBoard, or it ended or did not
            answer within ``ready_timeout_s`` (its last lines are in the message).
    """
    command = await asyncio.to_thread(_prepare, logdir)
    port = int(command[command.index("--port") + 1])
    server = TensorBoardServer(logdir, port, await start_child(command))
    server._reader = asyncio.ensure_future(read_lines(server.process, server.output.append))
    try:
        ready = Readiness(f"{server.url}data/runs", ready_timeout_s, "TensorBoard", lambda: _tail(server))
        await poll_until_ready(server.process, server._reader, ready)
    except BaseException:
        await server.stop(grace_s=2.0)
        raise
    return server


def _prepare(logdir: Path) -> list[str]:
    """Checks the folder holds event files and picks a port (blocking); returns the command line."""
    if not any(logdir.rglob("events.out.tfevents.*")):
        raise LocalToolError(
            f'{logdir} holds no TensorBoard event files: give a run trained with [tracking] report_to = ["tensorboard"]'
        )
    return tensorboard_command(local_python(), logdir.resolve(), free_port())


def _tail(server: TensorBoardServer) -> str:
    lines = [line.strip() for line in server.output if line.strip()]
    if any("No module named" in line and "tensorboard" in line for line in lines):
        return "the local tools lack TensorBoard: rentune tools install adds it"
    return " | ".join(lines[-3:])[-600:] or "no output"
