"""The contract between the desktop app and the trainer on the GPU machine (stdlib only).

The app writes a job spec (``job.json``) and reads the event stream (``events.jsonl``) that the payload appends to
in its output directory. Both sides import this module and nothing else from each other.
"""

from __future__ import annotations

from enum import StrEnum

PROTOCOL_VERSION = 1
EVENTS_FILE_NAME = "events.jsonl"
JOB_FILE_NAME = "job.json"


class JobState(StrEnum):
    """The phases a job reports in ``state`` events."""

    INSTALLING = "installing"
    DOWNLOADING = "downloading"
    PREPARING = "preparing"
    TRAINING = "training"
    SAVING = "saving"
    DONE = "done"
    FAILED = "failed"


TERMINAL_STATES = frozenset({JobState.DONE, JobState.FAILED})


class EventKind(StrEnum):
    """The kinds of lines in ``events.jsonl``."""

    STATE = "state"
    STEP = "step"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    DONE = "done"
    ERROR = "error"


class ErrorKind(StrEnum):
    """Why a job failed, so the app can show the right fix."""

    OOM = "oom"
    DATA = "data"
    DOWNLOAD = "download"
    DISK = "disk"
    CONFIG = "config"
    INTERNAL = "internal"
