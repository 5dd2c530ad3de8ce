"""A failed step's log, brought home before the machine may go.

A rented machine is terminated as soon as its run fails, so advice that points at a log on it points at nothing.
The machine is untrusted: only the end of a log comes home (at most :data:`LOG_LIMIT` bytes, within
:data:`LOG_SECONDS`), under a name this computer chose in the run's folder, with every known secret masked.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path, PurePosixPath

from desktop.services.machines.failures import MACHINE_ERRORS
from desktop.services.machines.machine import Machine
from desktop.services.platform.files import atomic_write_text
from desktop.services.platform.logs import get_logger, redact_known
from desktop.services.runs.context import RunContext

#: The most bytes of a log that come home: its end, where pip's and Python's last words are.
LOG_LIMIT = 1 << 20
#: Seconds allowed to bring a log home: a machine that never answers must not hold up the failure (or the terminate).
LOG_SECONDS = 60.0

_log = get_logger(__name__)


async def bring_log_home(ctx: RunContext, run_id: str, machine: Machine, remote_name: str) -> Path | None:
    """Copies the end of a log in the run's remote folder into the run's local folder, under the same file name.

    Where it is goes into the run's spec (``machine_log``): the monitor names it in its advice.

    Args:
        ctx: The engine's context.
        run_id: The run (or a node of it: each has its own folders).
        machine: The run's machine, still connected.
        remote_name: The log, relative to the run's remote folder (one of the payload's fixed names).

    Returns:
        The local copy, or None when the machine has no such log or could not give it (never raises: the failure
        it explains is said either way).
    """
    remote = f"{ctx.store.get(run_id).remote_dir}/{remote_name}"
    try:
        ending = await asyncio.wait_for(_log_end(machine, remote), LOG_SECONDS)
    except MACHINE_ERRORS as exc:  # TimeoutError included
        _log.warning("the log %s of run %s could not be brought home: %s", remote_name, run_id, exc)
        return None
    if ending is None:
        return None
    skipped, data = ending
    local = await asyncio.to_thread(_keep, ctx.folder(run_id) / PurePosixPath(remote_name).name, skipped, data)
    ctx.set_spec(run_id, machine_log=str(local))
    return local


def with_log(words: str, local: Path | None) -> str:
    """``words`` sending the user on to a log brought home (as they are when none came)."""
    return f"{words.rstrip('. ')}. The machine's log is on this computer: {local}" if local is not None else words


async def _log_end(machine: Machine, remote: str) -> tuple[int, bytes] | None:
    """(bytes left out at the start, the last :data:`LOG_LIMIT` bytes) of a remote file; None when it is missing."""
    size = _size_in(await machine.run(f"wc -c < {shlex.quote(remote)} 2>/dev/null || true"))
    skipped = max(0, size - LOG_LIMIT)
    data = await machine.read_from(remote, skipped, LOG_LIMIT)
    return None if data is None else (skipped, data[:LOG_LIMIT])


def _size_in(output: str) -> int:
    """The byte count ``wc -c`` printed; 0 for anything else (the machine is untrusted)."""
    text = output.strip()
    return int(text) if text.isdigit() and len(text) < 19 else 0


def _keep(local: Path, skipped: int, data: bytes) -> Path:
    """Writes the log's end to ``local`` atomically, secrets masked, saying how much of its start was left out."""
    text = redact_known(data.decode("utf-8", errors="replace"))
    if skipped:
        text = f"[the first {skipped:,} bytes of the machine's log were left out]\n{text}"
    return atomic_write_text(local, text)
