"""A trial trained by the payload itself on this computer (its NVIDIA GPU or its CPU), followed by its events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.runs.trial import TrialStep
from desktop.services.platform.secrets import without_secrets
from desktop.services.trial.errors import TrialError
from trainer_payload.protocol import EVENTS_FILE_NAME, EventKind, read_event_file

#: How often the events file is read while the trainer runs.
POLL_SECONDS = 0.25
#: Seconds a stopped trainer gets to end before it is killed.
STOP_GRACE = 5.0
JOB_NAME = "job.json"
LOG_NAME = "trainer.log"
PEAK_NAME = "peak_memory.json"


@dataclass(frozen=True)
class PayloadTraining:
    """What the payload trained: its steps, its training time, its peak memory and the adapter folder."""

    steps: tuple[TrialStep, ...]
    seconds: float
    peak_memory_gb: float | None
    adapter: Path


class _Follower:
    """Reads the trainer's events as they come: steps to report, the GPU's peak, the end."""

    def __init__(self, path: Path, on_step: Callable[[TrialStep], None] | None) -> None:
        self.path, self.on_step, self.offset = path, on_step, 0
        self.steps: list[TrialStep] = []
        self.gpu_peak: float | None = None
        self.done: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None

    def read(self) -> None:
        tail = read_event_file(self.path, self.offset)
        self.offset = tail.offset
        for typed in tail.events:
            event: dict[str, Any] = dict(typed)
            kind = event["event"]
            if kind is EventKind.STEP:
                step = TrialStep(int(event["step"]), float(event["loss"]), event.get("tokens_per_s"))
                self.steps.append(step)
                if self.on_step is not None:
                    self.on_step(step)
            elif kind is EventKind.CALIBRATION:
                self.gpu_peak = event.get("peak_reserved_gb")
            elif kind is EventKind.DONE:
                self.done = event
            elif kind is EventKind.ERROR:
                self.error = event


async def train_with_payload(
    python: str, folder: Path, job: dict[str, Any], *, on_step: Callable[[TrialStep], None] | None = None
) -> PayloadTraining:
    """Trains ``job`` with the payload in ``folder`` (its data beside it), reporting each step as it comes.

    Raises:
        TrialError: The trainer failed; the message is its own error and hint, or the end of its output.
        asyncio.CancelledError: The trial was stopped (the trainer is stopped, then killed).
    """
    (folder / JOB_NAME).write_text(json.dumps(job), encoding="utf-8")
    follower = _Follower(folder / str(job["output_dir"]) / EVENTS_FILE_NAME, on_step)
    started = time.monotonic()
    with (folder / LOG_NAME).open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            python,
            *("-m", "desktop.services.trial.peak_memory", str(folder / PEAK_NAME)),
            *("trainer_payload", "run", str(folder / JOB_NAME)),
            cwd=folder,
            env=without_secrets() | {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        while process.returncode is None:
            follower.read()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), POLL_SECONDS)
    except asyncio.CancelledError:
        await _stop(process)
        raise
    follower.read()
    seconds = time.monotonic() - started
    if process.returncode != 0 or follower.done is None:
        raise TrialError(_failure(follower.error, folder / LOG_NAME))
    adapter = folder / str(job["output_dir"]) / str(follower.done["adapter_path"])
    return PayloadTraining(tuple(follower.steps), seconds, follower.gpu_peak or _peak(folder / PEAK_NAME), adapter)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    process.terminate()  # the payload saves nothing in a trial: it just ends
    try:
        await asyncio.wait_for(process.wait(), STOP_GRACE)
    except TimeoutError:
        process.kill()
        await process.wait()


def _peak(path: Path) -> float | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, int | float) else None


def _failure(error: dict[str, Any] | None, log: Path) -> str:
    if error is not None:
        hint = f"; {error['hint']}" if error.get("hint") else ""
        return f"the trial's trainer stopped: {error['message']}{hint}"
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-6:]
    except OSError:
        lines = []
    return f"the trial's trainer stopped without a result ({' / '.join(lines) or 'no output'}); its log is {log}"
