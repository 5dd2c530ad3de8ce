"""A run's tracker dashboard on this computer: TensorBoard or trackio from the local tools, in a child process.

A run with ``[tracking] report_to = ["tensorboard"]`` or ``["trackio"]`` brings its logs home inside every checkpoint
and the adapter (see :class:`desktop.services.runs.snapshot.LocalFiles`). The dashboard listens on 127.0.0.1 only,
without any secret in its environment, and ends with the app: it runs under the same lifeline as the chat server
(see :func:`~desktop.services.serving.local_server.lifeline`). trackio is shown a copy of the logs, never the sealed
files themselves (it upgrades its database in place).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
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

#: A trackio project's database name as the payload writes it (anything else in the folder is not shown).
_PROJECT_DB = re.compile(r"[A-Za-z0-9._-]{1,64}\.db")


class Tracker(StrEnum):
    """The trackers whose logs come home, each with a dashboard of its own."""

    TENSORBOARD = "tensorboard"
    TRACKIO = "trackio"

    @property
    def label(self) -> str:
        """The dashboard's name as shown to a user."""
        return {Tracker.TENSORBOARD: "TensorBoard", Tracker.TRACKIO: "trackio"}[self]


@dataclass
class Dashboard:
    """A running dashboard: the logs it shows and where it answers.

    Attributes:
        tracker: Which dashboard.
        logdir: The folder of logs (as it is at home).
        port: Its port on 127.0.0.1.
        process: Its process.
        output: Its last lines of output, for the message when it ends.
    """

    tracker: Tracker
    logdir: Path
    port: int
    process: asyncio.subprocess.Process
    output: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    scratch: Path | None = None
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
        """Ends the dashboard: asked to stop, then killed after ``grace_s``; its copy of the logs goes."""
        await stop_child(self.process, self._reader, grace_s)
        if self.scratch is not None:
            await asyncio.to_thread(shutil.rmtree, self.scratch, True)


async def start_dashboard(tracker: Tracker, logdir: Path, *, ready_timeout_s: float = 60.0) -> Dashboard:
    """Starts the tracker's dashboard for ``logdir`` and returns once it answers.

    Raises:
        LocalToolError: The folder holds no logs of that tracker, the local tools lack it, or it ended or did not
            answer within ``ready_timeout_s`` (its last lines are in the message).
    """
    port = await asyncio.to_thread(free_port)
    command, scratch = await asyncio.to_thread(_prepare, tracker, logdir, port)
    board = Dashboard(tracker, logdir, port, await start_child(command), scratch=scratch)
    board._reader = asyncio.ensure_future(read_lines(board.process, board.output.append))
    try:
        probe = "data/runs" if tracker is Tracker.TENSORBOARD else "version"
        ready = Readiness(f"{board.url}{probe}", ready_timeout_s, tracker.label, lambda: _tail(board))
        await poll_until_ready(board.process, board._reader, ready)
    except BaseException:
        await board.stop(grace_s=2.0)
        raise
    return board


def tensorboard_command(python: Path, logdir: Path, port: int) -> list[str]:
    """TensorBoard on 127.0.0.1 for ``logdir``, under the lifeline."""
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


def trackio_command(python: Path, logdir: Path, project: str, port: int) -> list[str]:
    """Trackio's dashboard on 127.0.0.1 for the project's database in ``logdir``, under the lifeline.

    trackio reads its folder from ``TRACKIO_DIR`` when it is imported and has no port option on its command line, so
    the child sets one and calls ``trackio.show`` itself (no browser: the app opens the page).
    """
    show = (
        f"import os\nos.environ['TRACKIO_DIR'] = {str(logdir)!r}\nimport trackio\n"
        f"trackio.show(project={project!r}, open_browser=False, block_thread=True, host={HOST!r}, server_port={port})\n"
    )
    code = lifeline("trackio").replace("runpy.run_module('trackio', run_name='__main__', alter_sys=True)\n", show)
    return [str(python), "-c", code]


def _prepare(tracker: Tracker, logdir: Path, port: int) -> tuple[list[str], Path | None]:
    """Checks the folder holds the tracker's logs (blocking); the command line, and the copy trackio is shown."""
    if tracker is Tracker.TENSORBOARD:
        if not any(logdir.rglob("events.out.tfevents.*")):
            raise LocalToolError(_no_logs(tracker, logdir, "TensorBoard event files"))
        return tensorboard_command(local_python(), logdir.resolve(), port), None
    projects = sorted(p for p in logdir.glob("*.db") if _PROJECT_DB.fullmatch(p.name))
    if not projects:
        raise LocalToolError(_no_logs(tracker, logdir, "trackio database"))
    scratch = Path(tempfile.mkdtemp(prefix="rentune-trackio-"))
    for database in projects:
        shutil.copy2(database, scratch / database.name)
    return trackio_command(local_python(), scratch, projects[0].stem, port), scratch


def _no_logs(tracker: Tracker, logdir: Path, what: str) -> str:
    return f'{logdir} holds no {what}: give a run trained with [tracking] report_to = ["{tracker.value}"]'


def _tail(board: Dashboard) -> str:
    lines = [line.strip() for line in board.output if line.strip()]
    if any("No module named" in line and board.tracker.value in line for line in lines):
        return f"the local tools lack {board.tracker.label}: rentune tools install adds it"
    return " | ".join(lines[-3:])[-600:] or "no output"
