"""Holding every rank of a run at a step boundary while the user decides on an overrun.

The desktop writes the pause file (:data:`~trainer_payload.protocol.PAUSE_FILE_NAME`) in the head's output folder.
After every optimizer step the ranks already agree, in one tiny all-reduce, on stops and timed saves; the pause rides
in it: rank 0 reads the file, and any rank's flag holds them all, so every rank of every machine stops at the end of
the same step (signalling one process stopped only the launcher, never its ranks).

While they hold, every rank takes part in a small all-reduce each beat (a collective heartbeat: no rank sits in one
long collective that the process group's timeout, or gloo's, would end). Its answer is the same on every rank, so
they leave the hold in the same beat and act alike: all go on (the file is gone), or all save that step and stop (the
desktop's answer, a SIGTERM that reached any rank, or no answer within the hold's limit: the desktop may be gone).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainer_payload.protocol import HoldOutcome, PauseRequest, read_pause_request

#: Seconds between the held ranks' heartbeats: how soon an answer is acted on, and far below any collective timeout.
HEARTBEAT_SECONDS = 1.0

#: Combines one flag tuple from every rank into the tuple every rank acts on (a flag is set when any rank's is).
Agree = Callable[[tuple[bool, ...]], tuple[bool, ...]]


class Stopping(Protocol):
    """The trainer's stop flags, as a hold reads and keeps them (``trainer_payload.train.Stop``)."""

    terminated: bool
    last_activity: float


@dataclass(frozen=True)
class PauseWatch:
    """Where a rank looks for the pause file: global rank 0 reads the head's; the others learn by agreeing.

    Attributes:
        path: The pause file this rank reads, or None for a rank that reads none.
    """

    path: Path | None

    def request(self) -> PauseRequest | None:
        """The desktop's request now (None: no hold asked, or this rank reads none); blocking."""
        return read_pause_request(self.path) if self.path is not None else None

    def asked(self) -> bool:
        """Whether this rank sees a hold asked (its flag in the agreement after a step)."""
        return self.request() is not None


@dataclass(frozen=True)
class Hold:
    """How a hold ended, alike on every rank.

    Attributes:
        outcome: Go on, or save and stop (asked, or no answer in time).
        seconds: How long this rank held.
    """

    outcome: HoldOutcome
    seconds: float


def hold(
    watch: PauseWatch,
    agree: Agree,
    stop: Stopping,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Hold:
    """Holds this rank, beside every other, until they agree to go on or to stop; returns how it ended.

    Every rank calls it in the same step (they agreed to hold) and beats at the same pace: each beat is one
    all-reduce of (held, stop, out of time). Only the reading rank says held or out of time; any rank says stop when
    its SIGTERM came. A stop outranks the limit, and both outrank going on.
    """
    started = clock()
    while True:
        sleep(HEARTBEAT_SECONDS)
        stop.last_activity = time.monotonic()  # held on purpose: the idle watchdog must not read it as stuck
        held, stopping, late = agree(_beat_flags(watch.request(), stop.terminated, clock() - started))
        if stopping:
            return Hold(HoldOutcome.STOP, clock() - started)
        if late:
            return Hold(HoldOutcome.NO_ANSWER, clock() - started)
        if not held:
            return Hold(HoldOutcome.CONTINUE, clock() - started)


def _beat_flags(request: PauseRequest | None, terminated: bool, held_for: float) -> tuple[bool, bool, bool]:
    """One rank's (held, stop, out of time) for a beat: a rank that reads no file says only its own SIGTERM."""
    if request is None:
        return False, terminated, False
    return not request.stop, terminated or request.stop, held_for > request.hold_seconds


def say(rank: str, words: str) -> None:
    """One line on the rank's log (``payload.log``): every rank says where it holds and how it left."""
    # One write of the whole line: the payload runs unbuffered (PYTHONUNBUFFERED), where print() writes the words and
    # the newline apart, and every rank appends to the same log (another rank's line could land between them).
    sys.stderr.write(f"rank {rank}: {words}\n")
    sys.stderr.flush()
