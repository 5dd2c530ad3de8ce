"""Turning exceptions into ``error`` events: a kind the app understands and the hint a user needs."""

from __future__ import annotations

import errno
import json
from pathlib import Path

from trainer_payload.protocol import EVENTS_FILE_NAME, ErrorKind, EventKind, EventWriter, JobSpecError, JobState

#: Exit code of a payload command whose job file is invalid.
EXIT_CONFIG = 2


class DataError(ValueError):
    """A dataset row cannot be trained on; the message names the file, line and problem."""


_HINTS = {
    ErrorKind.OOM: "out of GPU memory: reduce --seq-len or --micro-batch, use qlora, or rent a larger GPU",
    ErrorKind.DATA: "fix the dataset (rentune data check FILE shows every problem) and start again",
    ErrorKind.DOWNLOAD: "check the model id, the HF token for gated models, and the machine's network",
    ErrorKind.DISK: "the machine's disk is full: keep fewer checkpoints or rent more disk",
    ErrorKind.CONFIG: "fix the job settings named above",
    ErrorKind.INSTALL: (
        "the machine could not install the trainer's packages (pip's last lines above): check its network, disk "
        "and Python version; the image's torch was left as it was"
    ),
    ErrorKind.INTERNAL: "a bug or an environment problem: the machine's log has the details; the run can be resumed",
}


def hint(kind: ErrorKind) -> str:
    """The one-line fix for a kind of error."""
    return _HINTS[kind]


def classify(exc: BaseException) -> ErrorKind:
    """Maps an exception raised while training to an error kind."""
    name = type(exc).__name__
    text = str(exc).lower()
    if name in {"OutOfMemoryError"} or "out of memory" in text:
        return ErrorKind.OOM
    if isinstance(exc, DataError):
        return ErrorKind.DATA
    if isinstance(exc, JobSpecError):
        return ErrorKind.CONFIG
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return ErrorKind.DISK
    if name in {
        "RepositoryNotFoundError",
        "GatedRepoError",
        "LocalEntryNotFoundError",
        "HfHubHTTPError",
        "EntryNotFoundError",
        "RevisionNotFoundError",
    } or (isinstance(exc, OSError) and "huggingface" in text):
        return ErrorKind.DOWNLOAD
    return ErrorKind.INTERNAL


def output_dir_of(job_path: Path) -> Path:
    """The output folder a job file names, read leniently (the job file's folder when it names none)."""
    try:
        raw = json.loads(job_path.read_text(encoding="utf-8"))
        return (job_path.parent / str(raw["output_dir"])).resolve()
    except (OSError, ValueError, KeyError, TypeError):
        return job_path.resolve().parent


def config_error(job_path: Path, message: str) -> int:
    """Reports an invalid job file as a ``config`` error and a ``failed`` state; returns :data:`EXIT_CONFIG`."""
    events = EventWriter(output_dir_of(job_path) / EVENTS_FILE_NAME)
    events.emit(EventKind.ERROR, kind=ErrorKind.CONFIG.value, message=message, hint=hint(ErrorKind.CONFIG))
    events.emit(EventKind.STATE, state=JobState.FAILED.value, reason=message)
    return EXIT_CONFIG
