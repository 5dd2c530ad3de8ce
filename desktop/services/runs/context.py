"""What every part of the run engine shares: its options, its errors, and :class:`RunContext`.

The context holds the run store, the secrets, the options, the report line and the way to reach a machine, and
moves a run to paused or failed with the words the user sees.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import filelock

from desktop.core.runs.overrun import ASK_LIMIT_SECONDS
from desktop.core.runs.states import TERMINAL, RunState, check_transition
from desktop.core.settings import Settings
from desktop.services.billing.activity import mark_activity
from desktop.services.machines.failures import MACHINE_ERRORS, Backoff
from desktop.services.machines.machine import Connect, Machine
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.errors import RunBusyError
from desktop.services.runs.store import RunRecord, RunStore

Report = Callable[[str], None]
DRIVER_LOCK_NAME = ".driver.lock"
#: States in which a run has ended for now: its key comes off the machine.
ENDED = frozenset({*TERMINAL, RunState.FAILED})


@dataclass(frozen=True)
class EngineOptions:
    """Timing and limits of the engine.

    Attributes:
        poll_seconds: How often the event stream is read.
        grace_seconds: How long a machine may be unreachable before the run is paused.
        max_relaunches: Relaunches of a trainer that died without a final event.
        keep_local_checkpoints: Pulled checkpoints kept per run.
        on_overrun: When the first measured steps put the run over its budget or well over its estimate: ``ask``
            (with ``RunContext.ask_overrun``), ``continue`` or ``stop`` (:mod:`desktop.services.runs.overrun_check`).
        overrun_ask_seconds: The longest a paused run waits for that answer.
    """

    poll_seconds: float = 1.0
    grace_seconds: float = 120.0
    max_relaunches: int = 3
    keep_local_checkpoints: int = 3
    on_overrun: str = "continue"
    overrun_ask_seconds: float = ASK_LIMIT_SECONDS

    def with_settings(self, settings: Settings) -> EngineOptions:
        """These options with the user's preferences applied (how many pulled checkpoints a run keeps)."""
        return replace(self, keep_local_checkpoints=settings.keep_local_checkpoints)


@dataclass
class RunContext:
    """The engine's shared state: where runs are recorded, how machines are reached, and what the user is told.

    Attributes:
        store: The runs' records.
        secrets: Where the Hugging Face token is read from.
        options: Timing and limits.
        report: Receives one line per thing the user should know.
        connect: Logs in to a machine.
        pull_lock: Held while a checkpoint is pulled, so two pulls never write the same files.
        backoffs: The retry timing of each run being driven.
        spend: What a run has cost so far, with the cost of stopping it (None: its rate times its live time); a
            rented run's comes from the ledger.
        heartbeats: When each run's machine was last told somebody follows it (for its self-stop).
        ask_overrun: Asks the user whether a run whose measured estimate overruns goes on (the run id and the
            words); True to go on. None: an ``ask`` policy stops.
        before_end: Called with the run's id just before the run is marked ended (:meth:`end`); a rented run's
            driver marks its machines ``terminating`` there.
    """

    store: RunStore
    secrets: SecretStore
    options: EngineOptions
    report: Report
    connect: Connect
    pull_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    backoffs: dict[str, Backoff] = field(default_factory=dict)
    spend: Callable[[str], float] | None = None
    heartbeats: dict[str, float] = field(default_factory=dict)
    ask_overrun: Callable[[str, str], Awaitable[bool]] | None = None
    before_end: Callable[[str], None] | None = None

    def folder(self, run_id: str) -> Path:
        """The run's local folder."""
        return self.store.folder(run_id)

    def set_spec(self, run_id: str, **values: Any) -> RunRecord:
        """Updates some of the run's spec values."""
        return self.store.update(run_id, spec={**self.store.get(run_id).spec, **values})

    def pause(self, run_id: str, why: str) -> RunRecord:
        """Pauses the run (the machine is unreachable or lost), saying why."""
        self.report(f"paused: {why}")
        self.store.update(run_id, error=why)
        return self.store.transition(run_id, RunState.PAUSED, why)

    def fail(self, run_id: str, why: str) -> RunRecord:
        """Fails the run, saying why."""
        self.report(f"failed: {why}")
        self.store.update(run_id, error=why)
        return self.end(run_id, RunState.FAILED, why)

    def end(self, run_id: str, state: RunState, note: str = "") -> RunRecord:
        """Marks the run ended (finished, failed or cancelled), calling :attr:`before_end` first.

        The order matters for money: a rented run's machines go ``terminating`` before the run is ended, so a process
        killed between the two writes leaves rows every start terminates until gone.

        Raises:
            ValueError: ``state`` does not end a run.
            TransitionError: The run has already ended otherwise (finished or cancelled).
        """
        if state not in ENDED:
            raise ValueError(f"{state.value} does not end a run")
        check_transition(self.store.get(run_id).state, state)
        if self.before_end is not None:
            self.before_end(run_id)
        return self.store.transition(run_id, state, note)

    def made_progress(self, run_id: str) -> None:
        """The machine works: a later failure starts a fresh grace period."""
        backoff = self.backoffs.get(run_id)
        if backoff is not None:
            backoff.reset()

    def driver_lock(self, run_id: str) -> filelock.BaseFileLock:
        """One driver per run across processes: two would relaunch trainers and pull into the same folder.

        Raises:
            RunBusyError: Another process holds the run.
        """
        lock = filelock.FileLock(self.folder(run_id) / DRIVER_LOCK_NAME, blocking=False)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise RunBusyError(
                f"run {run_id} is already being followed by another Rentune window or `rentune resume`; "
                "use that one, or close it and try again"
            ) from exc
        return lock

    def progress(self, verb: str, run_id: str) -> Callable[[str, int, int], None]:
        """A transfer progress callback that reports large files about once a second.

        Every call also marks the run active (bytes moving), which the idle guard counts as work.
        """
        started, last = time.monotonic(), [0.0]
        folder = self.folder(run_id)

        def show(name: str, done: int, total: int) -> None:
            mark_activity(folder)
            now = time.monotonic()
            if total < 5_000_000 or (done < total and now - last[0] < 1):
                return  # small files: the folder-level message says enough
            last[0] = now
            rate = done / max(now - started, 1e-6)
            eta = (total - done) / rate if rate else 0.0
            self.report(
                f"{verb} {name}: {done / 1e6:,.1f} / {total / 1e6:,.1f} MB at {rate / 1e6:,.1f} MB/s, {eta:,.0f} s left"
            )

        return show


async def quietly_close(machine: Machine) -> None:
    """Closes a connection, ignoring a machine that no longer answers."""
    try:
        await asyncio.wait_for(machine.close(), 5)
    except MACHINE_ERRORS:
        return
