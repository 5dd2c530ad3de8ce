"""``rentune serve MODEL.gguf`` and ``rentune tensorboard RUN_ID``: a server on this computer until Ctrl-C.

``serve`` is an OpenAI-compatible endpoint for a GGUF; ``tensorboard`` shows a run's TensorBoard event files. Serve
prints the address and a request for curl and for Python's ``openai`` client, then serves; on Ctrl-C it stops the
server and says how many requests it answered; SIGTERM does the same, so the server never outlives the command.
``--port`` picks the port (default: a free one), ``--lora`` adds a GGUF LoRA (``rentune export --lora-gguf``),
``--context`` the context window.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.services.local.common import LocalToolError
from desktop.services.runs.snapshot import local_files
from desktop.services.runs.store import RunStore, UnknownRunError
from desktop.services.serving.dashboards import Tracker, start_dashboard
from desktop.services.serving.local_server import LocalServer, start_server


def run_serve(args: argparse.Namespace) -> int:
    """``rentune serve``: starts the server, says where it answers, serves until Ctrl-C or its end."""
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:  # Ctrl-C before the server answered: start_server stopped it
        return EXIT_OK


async def _serve(args: argparse.Namespace) -> int:
    print(f"Starting llama.cpp's server for {args.model} ...", flush=True)
    try:
        server = await start_server(args.model, port=args.port, lora=args.lora, context=args.context)
    except LocalToolError as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    print("\n".join(ready_lines(server)), flush=True)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    ended, stopped = asyncio.ensure_future(server.wait()), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({ended, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # Ctrl-C where signals cannot be handled (Windows): asyncio.run cancels this task
        await asyncio.shield(server.stop())
        print(f"Stopped after {_requests(server)}.", flush=True)
        raise
    finally:
        stopped.cancel()
        await asyncio.shield(server.stop())
        await asyncio.shield(ended)  # ends with the process
    if stop.is_set():
        print(f"Stopped after {_requests(server)}.", flush=True)
        return EXIT_OK
    code = server.process.returncode
    raise CliError(f"the server ended (exit {code}) after {_requests(server)}: {' | '.join(server.output)[-600:]}")


def _stop_on_signals(stop: asyncio.Event) -> None:
    """Ctrl-C and SIGTERM set ``stop``, so the server is ended with this command, never left behind."""
    if sys.platform == "win32":
        return  # asyncio takes no signal handlers there: Ctrl-C arrives as KeyboardInterrupt (handled in _serve)
    loop = asyncio.get_running_loop()
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stop.set)


def ready_lines(server: LocalServer) -> list[str]:
    """What ``rentune serve`` prints once the server answers."""
    examples = server.examples()
    return [
        f"Serving {server.model.name} at {server.url} (OpenAI-compatible, this computer only). Ctrl-C stops it.",
        "",
        "curl:",
        *(f"  {line}" for line in examples["curl"].splitlines()),
        "",
        "Python (pip install openai):",
        *(f"  {line}" for line in examples["python"].splitlines()),
    ]


def _requests(server: LocalServer) -> str:
    return f"{server.requests} request" + ("" if server.requests == 1 else "s")


def run_tensorboard(args: argparse.Namespace) -> int:
    """``rentune tensorboard RUN_ID|FOLDER``: TensorBoard for the run's event files at home, until Ctrl-C."""
    return _run_dashboard(Tracker.TENSORBOARD, args.run)


def run_trackio(args: argparse.Namespace) -> int:
    """``rentune trackio RUN_ID|FOLDER``: trackio's dashboard for the run's trackio database at home, until Ctrl-C."""
    return _run_dashboard(Tracker.TRACKIO, args.run)


def _run_dashboard(tracker: Tracker, what: str) -> int:
    try:
        return asyncio.run(_dashboard(tracker, what))
    except KeyboardInterrupt:
        return EXIT_OK


#: Each tracker's logs in words: what they are, the article before them, and the pronoun for them.
_LOG_WORDS = {
    Tracker.TENSORBOARD: ("TensorBoard event files", "", "them"),
    Tracker.TRACKIO: ("trackio database", "a ", "it"),
}


def tracker_logs(tracker: Tracker, what: str) -> Path:
    """The logs to show: a folder as given, or a run's newest at home.

    Raises:
        CliError: No such run or folder, or the run has none at home yet.
    """
    folder = Path(what).expanduser()
    if folder.is_dir():
        return folder
    store = RunStore()
    files, article, them = _LOG_WORDS[tracker]
    try:
        record = store.get(what)
    except UnknownRunError as exc:
        raise CliError(f"{exc}, or give a folder holding {article}{files}") from exc
    logs = local_files(store, record).tracker_logs(tracker.value)
    if logs is None:
        raise CliError(
            f"run {record.id} has no {files} here: a run with [tracking] report_to = "
            f'["{tracker.value}"] brings {them} home with each checkpoint'
        )
    return logs


async def _dashboard(tracker: Tracker, what: str) -> int:
    logs = tracker_logs(tracker, what)
    print(f"Starting {tracker.label} for {logs} ...", flush=True)
    try:
        board = await start_dashboard(tracker, logs)
    except LocalToolError as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    print(f"{tracker.label} at {board.url} (this computer only). Ctrl-C stops it.", flush=True)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    ended, stopped = asyncio.ensure_future(board.process.wait()), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({ended, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        await asyncio.shield(board.stop())
    if stop.is_set():
        print(f"{tracker.label} stopped.", flush=True)
        return EXIT_OK
    raise CliError(f"{tracker.label} ended (exit {board.process.returncode}): {' | '.join(board.output)[-600:]}")
