"""Holding every rank of a run, on every machine, at a step boundary while the user decides (the pause file).

The desktop writes :data:`~trainer_payload.protocol.PAUSE_FILE_NAME` into the head's output folder; the head's rank 0
reads it and every rank of every machine agrees on it after each step (:mod:`trainer_payload.pause`), so the whole run
holds at the end of the same step, and goes on (the file deleted) or saves that step and stops (the file says stop)
together. One file on the head is the one answer for all: a machine cannot be left holding by a copy of its own.
A signal held only the process it was sent to: on several GPUs or machines, the launcher, while its ranks trained on.
"""

from __future__ import annotations

import shlex

from desktop.services.machines.machine import Machine
from desktop.services.runs.store import RunRecord
from trainer_payload.protocol import PAUSE_FILE_NAME, PauseRequest

#: Seconds the ranks hold past the desktop's own limit before they stop by themselves: the desktop answers first.
HOLD_GRACE_SECONDS = 120.0


def pause_path(record: RunRecord) -> str:
    """The pause file of the run's trainer on its machine (the head's, for a run across several)."""
    return f"{record.remote_dir}/out/{PAUSE_FILE_NAME}"


async def ask_to_hold(machine: Machine, record: RunRecord, request: PauseRequest) -> None:
    """Asks every rank to hold at its next step boundary, for at most ``request.hold_seconds``."""
    await _write(machine, record, request)


async def let_go(machine: Machine, record: RunRecord) -> None:
    """Every rank goes on, together: the pause file is deleted."""
    await machine.run(f"rm -f {shlex.quote(pause_path(record))}")


async def answer_stop(machine: Machine, record: RunRecord, request: PauseRequest) -> None:
    """Every rank saves the step it holds at and stops, together: the answer is written into the pause file."""
    await _write(machine, record, PauseRequest(request.hold_seconds, stop=True))


async def _write(machine: Machine, record: RunRecord, request: PauseRequest) -> None:
    """Replaces the pause file at once (written aside, then renamed): rank 0 never reads half of it."""
    path = shlex.quote(pause_path(record))
    aside = shlex.quote(f"{pause_path(record)}.tmp")
    await machine.run(f"printf '%s\\n' {shlex.quote(request.to_text())} > {aside} && mv -f {aside} {path}")
