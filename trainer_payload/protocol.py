"""The contract between the desktop app and the trainer on the GPU machine (stdlib only).

The app writes a job spec (``job.json``); the payload appends events to ``events.jsonl`` in the job's output
directory, one JSON object per line, each with ``ts``, ``seq`` and ``event``. Both sides import this module and
nothing else from each other. A reader tails the events from a byte offset, so the app can reconnect at any time and
continue without losing or repeating an event.
"""

from __future__ import annotations

import json
import os
import time
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = 1
EVENTS_FILE_NAME = "events.jsonl"
JOB_FILE_NAME = "job.json"
CHECKPOINT_MARKER = "rentune_checkpoint.json"
STOP_MARKER_NAME = "STOP_MACHINE"
ADAPTER_DIR_NAME = "adapter"
#: The payload's virtual environment, relative to the run folder (the folder of ``job.json``). The bootstrap
#: creates it over the machine's Python; the trainer must run with :data:`VENV_PYTHON`.
VENV_DIR = ".venv"
VENV_PYTHON = f"{VENV_DIR}/bin/python"


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


class StopCause(StrEnum):
    """Why a ``failed`` state that is no failure ended the job (the ``stopped_by`` field)."""

    SIGNAL = "signal"  # SIGTERM: asked to stop (a user's stop, a budget): a checkpoint was saved


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
    INSTALL = "install"
    INTERNAL = "internal"


class JobSpecError(ValueError):
    """The job spec is invalid; the message names the key and what is allowed."""


class EventError(ValueError):
    """A line of ``events.jsonl`` is not a valid event (torn, not JSON, a field missing or of the wrong type)."""


class UnsafePathError(EventError):
    """An event names a file that is not a plain relative path inside its folder."""


_NUMBER = (int, float)
# The fields each kind of event must carry, and their JSON types; other fields are free.
_REQUIRED_FIELDS: dict[EventKind, dict[str, tuple[type, ...]]] = {
    EventKind.STATE: {"state": (str,)},
    EventKind.STEP: {"step": (int,), "loss": _NUMBER},
    EventKind.EVAL: {"step": (int,), "eval_loss": _NUMBER},
    EventKind.CHECKPOINT: {"step": (int,), "path": (str,), "bytes": (int,), "sha256": (dict,)},
    EventKind.DONE: {"adapter_path": (str,), "files": (dict,)},
    EventKind.ERROR: {"kind": (str,), "message": (str,)},
}
# Fields that may be missing or null, and their JSON types when present.
_OPTIONAL_FIELDS: dict[EventKind, dict[str, tuple[type, ...]]] = {
    EventKind.STATE: {"reason": (str,), "stopped_by": (str,)},
    EventKind.STEP: {"total_steps": (int,), "epoch": _NUMBER, "lr": _NUMBER, "tokens_per_s": _NUMBER},
    EventKind.EVAL: {},
    EventKind.CHECKPOINT: {},
    EventKind.DONE: {"bytes": (int,), "train_seconds": _NUMBER, "wall_seconds": _NUMBER, "metrics": (dict,)},
    EventKind.ERROR: {"hint": (str,)},
}
_HEX = frozenset("0123456789abcdef")


def validate_event(obj: object) -> dict[str, Any]:
    """Checks a decoded event line against the protocol and returns it.

    Every event has a number ``ts``, a positive whole ``seq`` and a known ``event``; each kind has its fields
    (see ``_REQUIRED_FIELDS``). File names in ``checkpoint`` and ``done`` events must be plain relative paths.

    Raises:
        UnsafePathError: A file name could leave its folder.
        EventError: The line is not a valid event; the message names the field.
    """
    if not isinstance(obj, dict):
        raise EventError("an event must be a JSON object")
    _check_field(obj, "ts", _NUMBER)
    _check_field(obj, "seq", (int,))
    _check_field(obj, "event", (str,))
    if obj["seq"] < 1:
        raise EventError(f"seq {obj['seq']} must be 1 or more")
    try:
        kind = EventKind(obj["event"])
    except ValueError:
        raise EventError(f"unknown event kind {obj['event']!r}") from None
    for name, allowed in _REQUIRED_FIELDS[kind].items():
        _check_field(obj, name, allowed)
    for name, allowed in _OPTIONAL_FIELDS[kind].items():
        if obj.get(name) is not None:
            _check_field(obj, name, allowed)
    if kind is EventKind.CHECKPOINT:
        check_relative_path(obj["path"])
        _check_digests(obj["sha256"])
    elif kind is EventKind.DONE:
        check_relative_path(obj["adapter_path"])
        _check_digests(obj["files"])
    return obj


def _check_field(obj: dict[str, Any], name: str, types: tuple[type, ...]) -> None:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, types):
        wanted = " or ".join(t.__name__ for t in types)
        raise EventError(f"{obj.get('event', 'event')} field {name!r} must be {wanted}, not {json.dumps(value)[:60]}")


def _check_digests(files: dict[str, Any]) -> None:
    for name, digest in files.items():
        check_relative_path(name)
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
            raise EventError(f"the SHA-256 of {name!r} is not 64 hex digits")


def check_relative_path(text: str) -> str:
    """Returns ``text`` when it is a plain, normalised relative POSIX path that stays inside its folder.

    Raises:
        UnsafePathError: It is empty, absolute, has ``..``, ``.`` or empty parts, a backslash, a drive letter or a
            control character.
    """
    problem = _path_problem(text)
    if problem is not None:
        raise UnsafePathError(f"{text!r} ({problem})")
    return text


def _path_problem(text: str) -> str | None:
    parts = text.split("/")
    checks = (
        (not text, "it is empty"),
        (text.startswith("/"), "it is absolute"),
        ("\\" in text, "it has a backslash"),
        (text[1:2] == ":", "it has a drive letter"),
        (any(ord(char) < 32 for char in text), "it has a control character"),
        (".." in parts, "it climbs out with '..'"),
        (any(part in {"", "."} for part in parts), "it is not normalised"),
    )
    return next((why for bad, why in checks if bad), None)


@dataclass(frozen=True)
class EventChunk:
    """Events parsed from a chunk of ``events.jsonl``.

    Attributes:
        events: The valid events of its complete lines, in order.
        used: Bytes of the chunk those lines took (a trailing partial line is left for the next read).
        skipped: Why each torn or malformed line was skipped, for the log.
    """

    events: list[dict[str, Any]]
    used: int
    skipped: list[str]


def parse_event_chunk(data: bytes) -> EventChunk:
    """Parses and validates the complete lines of a chunk; a torn or malformed line is skipped, not fatal.

    Raises:
        UnsafePathError: A line is a well-formed event naming an unsafe file (the sender is not to be trusted).
    """
    end = data.rfind(b"\n") + 1
    events: list[dict[str, Any]] = []
    skipped: list[str] = []
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            events.append(validate_event(json.loads(line)))
        except UnsafePathError:
            raise
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8 and protocol errors alike
            skipped.append(f"{str(exc)[:200]} in {line[:80]!r}")
    return EventChunk(events, end, skipped)


METHODS = ("qlora", "lora", "full", "full-8bit")
ENGINES = ("trl", "unsloth")
STRATEGIES = ("ddp", "fsdp")
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")


@dataclass(frozen=True)
class JobSpec:
    """What to train and how (``job.json``). Relative paths are relative to the job file.

    The keys are fixed by the protocol; see the field names. ``epochs`` is used when ``max_steps`` is 0 or less.
    """

    base_model: str
    train_file: str
    output_dir: str
    version: int = PROTOCOL_VERSION
    eval_file: str | None = None
    method: str = "qlora"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"
    seq_len: int = 2048
    micro_batch: int = 2
    grad_accum: int = 4
    epochs: float = 3.0
    max_steps: int = -1
    learning_rate: float = 2e-4
    lr_scheduler: str = "cosine"
    warmup_ratio: float = 0.03
    seed: int = 42
    checkpoint_steps: int = 0
    checkpoint_minutes: float = 30.0
    keep_checkpoints: int = 3
    engine: str = "trl"
    num_gpus: int = 1
    strategy: str = "ddp"
    gradient_checkpointing: bool = True
    eval_steps: int = 0
    idle_stop_minutes: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any], base_dir: Path | None = None) -> JobSpec:
        """Validates a decoded ``job.json`` and resolves its relative paths against ``base_dir``.

        A key whose value is ``null`` is not set: it takes its default.

        Raises:
            JobSpecError: A key is unknown, missing, of the wrong type or out of range; the message names it.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobSpecError(f"unknown job keys: {', '.join(unknown)}")
        given = {key: value for key, value in data.items() if value is not None}
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [key for key in required if not given.get(key)]
        if missing:
            raise JobSpecError(f"missing job keys: {', '.join(missing)}")
        spec = cls(**_checked_types(given))
        spec.validate()
        return spec.resolved(base_dir) if base_dir else spec

    @classmethod
    def load(cls, path: Path) -> JobSpec:
        """Reads and validates a job file."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise JobSpecError(f"job file {path} does not exist") from exc
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"job file {path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise JobSpecError(f"job file {path} must hold a JSON object")
        return cls.from_dict(data, path.resolve().parent)

    def resolved(self, base_dir: Path) -> JobSpec:
        """Returns the spec with file paths made absolute against ``base_dir`` (Hub model ids stay as they are)."""

        def absolute(value: str | None) -> str | None:
            return None if value is None else str((base_dir / value).resolve())

        model = self.base_model
        if model.startswith((".", "/")) or (base_dir / model).exists():
            model = str((base_dir / model).resolve())
        return _replace(
            self,
            base_model=model,
            train_file=absolute(self.train_file),
            eval_file=absolute(self.eval_file),
            output_dir=absolute(self.output_dir),
        )

    def validate(self) -> None:
        """Checks every value; raises :class:`JobSpecError` naming the first bad one."""
        if self.version != PROTOCOL_VERSION:
            raise JobSpecError(f"version {self.version} is not supported (this payload speaks {PROTOCOL_VERSION})")
        _choice("method", self.method, METHODS)
        _choice("engine", self.engine, ENGINES)
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("lr_scheduler", self.lr_scheduler, SCHEDULERS)
        for key, (low, high) in JOB_INT_RANGES.items():
            _int_range(key, getattr(self, key), low, high)
        if not (self.max_steps > 0 or 0 < self.epochs <= 1000):
            raise JobSpecError("set max_steps above 0, or epochs above 0 (at most 1000)")
        if not 0 < self.learning_rate < 1:
            raise JobSpecError(f"learning_rate {self.learning_rate} must be above 0 and below 1")
        if not 0 <= self.lora_dropout < 1:
            raise JobSpecError(f"lora_dropout {self.lora_dropout} must be at least 0 and below 1")
        if self.checkpoint_minutes < 0 or self.idle_stop_minutes < 0:
            raise JobSpecError("checkpoint_minutes and idle_stop_minutes must not be negative")
        if not (
            self.target_modules == "all-linear"
            or (isinstance(self.target_modules, list) and all(isinstance(m, str) for m in self.target_modules))
        ):
            raise JobSpecError('target_modules must be "all-linear" or a list of module names')

    def to_dict(self) -> dict[str, Any]:
        """The spec as ``job.json`` content."""
        return asdict(self)


def _checked_types(values: dict[str, Any]) -> dict[str, Any]:
    """The values with their types checked against the annotations of :class:`JobSpec` (ints become floats).

    Raises:
        JobSpecError: A value is not of its key's type; the message names the key.
    """
    declared = typing.get_type_hints(JobSpec)
    checked = {}
    for key, value in values.items():
        if not _matches(value, declared[key]):
            raise JobSpecError(f"{key} must be {_describe(declared[key])}, not {json.dumps(value)}")
        checked[key] = float(value) if declared[key] is float else value
    return checked


def _matches(value: object, declared: Any) -> bool:
    """Whether a decoded JSON value fits a type annotation (``bool`` is not a number here)."""
    origin = typing.get_origin(declared)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arm) for arm in typing.get_args(declared))
    if isinstance(value, bool) and declared is not bool:
        return declared is Any
    if origin in (list, dict):
        items = typing.get_args(declared)[0]
        return isinstance(value, origin) and (origin is dict or all(_matches(item, items) for item in value))
    return declared is Any or isinstance(value, int | float if declared is float else declared)


_TYPE_WORDS = {int: "a whole number", float: "a number", str: "text", bool: "true or false", type(None): "null"}


def _describe(declared: Any) -> str:
    """A type annotation in words: ``str | list[str]`` is "text or a list of text"."""
    origin = typing.get_origin(declared)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(declared))
    if origin is list:
        return "a list of " + _describe(typing.get_args(declared)[0]).removeprefix("a ")
    if origin is dict:
        return "an object"
    return _TYPE_WORDS.get(declared, str(declared))


def _replace(spec: JobSpec, **changes: Any) -> JobSpec:
    return JobSpec(**{**asdict(spec), **changes})


def _choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise JobSpecError(f"{key} {value!r} is not one of: {', '.join(allowed)}")


#: The allowed range (lowest, highest) of each whole-number job key: the payload checks them, and the app's CLI,
#: wizard and sizing take theirs from here (one source for both sides).
JOB_INT_RANGES: dict[str, tuple[int, int]] = {
    "lora_r": (1, 4096),
    "lora_alpha": (1, 65536),
    "seq_len": (16, 1_048_576),
    "micro_batch": (1, 1024),
    "grad_accum": (1, 4096),
    "num_gpus": (1, 64),
    "keep_checkpoints": (1, 1000),
    "checkpoint_steps": (0, 10**9),
    "seed": (0, 2**32 - 1),
    "eval_steps": (0, 10**9),
}


def job_default(key: str) -> Any:
    """The default of a job key (``seq_len`` -> 2048): the one source of training defaults for both sides.

    Raises:
        KeyError: The key is not a job key, or has no default (such as ``base_model``).
    """
    found = next((f for f in fields(JobSpec) if f.name == key), None)
    if found is None or found.default is MISSING:
        raise KeyError(key)
    return found.default


def _int_range(key: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise JobSpecError(f"{key} {value!r} must be a whole number from {low} to {high}")


class EventWriter:
    """Appends events to ``events.jsonl``, continuing the sequence numbers of an existing file.

    Each event is one ``write`` of a complete line followed by ``fsync``, so a reader never sees half an event
    that stays half, and a crash loses at most the event being written. A line torn by such a crash is ended
    before the next event, so it costs only itself; readers skip it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._seq = _last_seq(path)
        self._torn = _ends_mid_line(path)

    def emit(self, kind: EventKind, /, **fields_: Any) -> dict[str, Any]:
        """Writes one event and returns it (``fields_`` may hold a ``kind`` of its own, as error events do)."""
        self._seq += 1
        event = {"ts": round(time.time(), 3), "seq": self._seq, "event": kind.value, **fields_}
        line = (json.dumps(event, default=str) + "\n").encode("utf-8")
        if self._torn:
            line = b"\n" + line
        with self.path.open("ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self._torn = False
        return event


def _last_seq(path: Path) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return max((int(event["seq"]) for event in _parse_lines(data)), default=0)


def _ends_mid_line(path: Path) -> bool:
    """Whether the file's last line lacks its newline (a writer died mid-write)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    with path.open("rb") as handle:
        handle.seek(size - 1)
        return handle.read(1) != b"\n"


def _parse_lines(data: bytes) -> list[dict[str, Any]]:
    """The events in complete lines; a line that is not an event (torn by a crash, say) is skipped."""
    events = []
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("seq"), int) and isinstance(event.get("event"), str):
            events.append(event)
    return events


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Reads the complete events after byte ``offset``.

    Returns:
        The events, and the offset to pass next time (a trailing partial line is left for the next read).
    """
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    events, used = parse_event_lines(data)
    return events, offset + used


def parse_event_lines(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """Parses complete event lines from a chunk of bytes; returns them and how many bytes they used.

    Lines that are not events (a line torn by a crash) are skipped.
    """
    end = data.rfind(b"\n") + 1
    return _parse_lines(data[:end]), end
