"""The contract between the desktop app and the trainer on the GPU machine (stdlib only).

The app writes a job spec (``job.json``); the payload appends events to ``events.jsonl`` in the job's output
directory, one JSON object per line, each with ``ts``, ``seq`` and ``event``. Both sides import this module and
nothing else from each other. A reader tails the events from a byte offset, so the app can reconnect at any time and
continue without losing or repeating an event.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 1
EVENTS_FILE_NAME = "events.jsonl"
JOB_FILE_NAME = "job.json"
CHECKPOINT_MARKER = "rentune_checkpoint.json"
STOP_MARKER_NAME = "STOP_MACHINE"
#: In the output folder: the trainer's exit code, written as its launching process ends (absent: killed, or running).
#: On the other machines of a run across several (which write no events) it tells a finished node from a lost one.
TRAINER_EXIT_FILE_NAME = "trainer.exit"
#: In the output folder: touched by the desktop while it follows the run (the self-stop's "somebody is here").
HEARTBEAT_NAME = "HEARTBEAT"
#: In the output folder of the head (rank 0's machine): written by the desktop to hold every rank of the run, on every
#: machine, at its next step boundary while the user decides on an overrun (a :class:`PauseRequest` as JSON). Rank 0
#: reads it and the ranks agree in a collective, so one file holds them all; deleted, every rank goes on together.
PAUSE_FILE_NAME = "PAUSE"
#: In the output folder: the courier's (``python -m trainer_payload courier``) folder, holding the app's links ahead
#: (``mandate.json``), a line per checkpoint it sent or could not send (``receipts.jsonl``), and ``BUSY``, touched
#: while it sends (the self-stop waits for it while it is fresh).
COURIER_DIR_NAME = "courier"
MANDATE_FILE_NAME = "mandate.json"
RECEIPTS_FILE_NAME = "receipts.jsonl"
COURIER_BUSY_NAME = "BUSY"
#: Seconds after which a courier's ``BUSY`` counts as stale (a courier that stopped making progress).
COURIER_BUSY_SECONDS = 180.0
ADAPTER_DIR_NAME = "adapter"
#: After training, the export on the machine (``python -m trainer_payload export``): its job file and its outputs'
#: folder, both under ``out/``; the GGUF types llama.cpp's converter writes by itself, and the K-quants its quantise
#: tool writes (built on the machine from llama.cpp's source first).
EXPORT_JOB_FILE_NAME = "export-job.json"
EXPORT_DIR_NAME = "export"
#: In the export's folder: base against tuned on the held-out rows, when the export job asks to judge (the
#: :mod:`trainer_payload.compare` result, with ``usable_rows``).
JUDGE_FILE_NAME = "judge.json"
CONVERTER_GGUF_TYPES = ("F16", "BF16", "Q8_0")
QUANTIZE_GGUF_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K")
ON_MACHINE_GGUF_TYPES = (*CONVERTER_GGUF_TYPES, *QUANTIZE_GGUF_TYPES)
#: Serving after training (``python -m trainer_payload serve``), under ``out/``: its job, the state it keeps (a
#: :class:`ServeState` as JSON, rewritten whole on each change), its folder (the GGUF llama.cpp's server loads) and its
#: server's log.
SERVE_JOB_FILE_NAME = "serve-job.json"
SERVE_STATE_FILE_NAME = "serve-state.json"
SERVE_DIR_NAME = "serve"
SERVE_LOG_NAME = "serve.log"
#: A request an OpenAI-compatible server's access log names (uvicorn's line, as vLLM and llama-cpp-python write it):
#: ``"POST /v1/chat/completions HTTP/1.1" 200``.
SERVED_REQUEST = re.compile(r'"POST /v1/(?:chat/completions|completions|embeddings) HTTP/[0-9.]+" (\d{3})')
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


class HoldOutcome(StrEnum):
    """How a hold at a step boundary ended (the ``outcome`` of a ``hold`` event)."""

    CONTINUE = "continue"  # the pause file was deleted: every rank went on
    STOP = "stop"  # the desktop answered stop (or SIGTERM came): every rank saved the same step and stopped
    NO_ANSWER = "no_answer"  # nobody answered within the hold's limit: saved and stopped, as a stop would


class ServePhase(StrEnum):
    """Where serving after training is (the ``phase`` of a :class:`ServeState`)."""

    PREPARING = "preparing"  # making what the server loads (llama.cpp's: the merged model as a GGUF)
    STARTING = "starting"  # the server loads the model
    SERVING = "serving"  # it answered its first request on the machine
    ENDED = "ended"  # it stopped: idle, asked to, or it failed (``reason`` says which)


@dataclass(frozen=True)
class ServeState:
    """What the machine says about its server. The app reads it from a rented machine: untrusted until parsed.

    Attributes:
        phase: Where serving is.
        pid: The serving process (the one to stop).
        backend: ``vllm`` or ``llama.cpp``.
        port: The server's port on the machine's 127.0.0.1 (0 until chosen).
        model: The name requests give as their ``model``.
        requests: Completion requests answered so far.
        last_request_at: When the last one came (epoch seconds; 0: none yet).
        ready_at: When the server first answered (epoch seconds; 0: not yet).
        idle_minutes: It stops after this long without a request.
        reason: Why it ended (empty while it runs).
        detail: What it is doing now, in words.
    """

    phase: ServePhase
    pid: int = 0
    backend: str = ""
    port: int = 0
    model: str = ""
    requests: int = 0
    last_request_at: float = 0.0
    ready_at: float = 0.0
    idle_minutes: float = 0.0
    reason: str = ""
    detail: str = ""

    def to_json(self) -> str:
        """The state as one JSON object."""
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, text: str) -> ServeState:
        """Reads a state a machine wrote, field by field.

        Raises:
            ValueError: It is not JSON, names an unknown phase or backend, or a field has the wrong type or range.
        """
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("the serve state is not a JSON object")
        phase = ServePhase(str(raw.get("phase")))
        backend = str(raw.get("backend", ""))
        if backend not in ("", "vllm", "llama.cpp"):
            raise ValueError(f"unknown serving backend {backend[:40]!r}")
        pid, port, requests = (raw.get(name, 0) for name in ("pid", "port", "requests"))
        if any(type(v) is not int or v < 0 for v in (pid, port, requests)) or port > 65535:
            raise ValueError(f"bad numbers in the serve state: pid {pid!r}, port {port!r}, requests {requests!r}")
        last, ready, idle = (raw.get(name, 0.0) for name in ("last_request_at", "ready_at", "idle_minutes"))
        times = (last, ready, idle)
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e12 for v in times):
            raise ValueError(f"bad times in the serve state: {last!r}, {ready!r}, {idle!r}")
        model, reason, detail = (str(raw.get(name, ""))[:600] for name in ("model", "reason", "detail"))
        return cls(phase, pid, backend, port, model, requests, float(last), float(ready), float(idle), reason, detail)


#: The longest hold a pause file may ask for (a damaged or hostile number is cut to it): an hour of paid idle time.
MAX_HOLD_SECONDS = 3600.0
#: The hold of a pause file that does not say (or cannot be read): the desktop's ten minutes and two to spare.
DEFAULT_HOLD_SECONDS = 720.0


@dataclass(frozen=True)
class PauseRequest:
    """What the desktop asks of a held run, in the pause file (:data:`PAUSE_FILE_NAME`).

    Attributes:
        hold_seconds: The longest the ranks hold, counted from when they begin to: past it they save a checkpoint
            and stop, as if told to (the desktop that asked may be gone; no answer in time is a stop).
        stop: The desktop's answer: every rank saves the step it holds at and stops (the desktop sends SIGTERM too).
    """

    hold_seconds: float = DEFAULT_HOLD_SECONDS
    stop: bool = False

    def to_text(self) -> str:
        """The file's content: one JSON object."""
        return json.dumps({"hold_seconds": self.hold_seconds, "stop": self.stop})

    @classmethod
    def parse(cls, text: str) -> PauseRequest:
        """The request a pause file holds; what cannot be read holds with the default limit (never raises).

        The file exists, so a hold was asked: a torn or damaged one still holds, and the limit still ends it.
        """
        try:
            data = json.loads(text)
        except ValueError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        seconds = data.get("hold_seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            seconds = DEFAULT_HOLD_SECONDS
        return cls(max(0.0, min(MAX_HOLD_SECONDS, float(seconds))), data.get("stop") is True)


def read_pause_request(path: Path) -> PauseRequest | None:
    """The pause file's request, or None when there is none (every rank trains on); blocking."""
    try:
        return PauseRequest.parse(path.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        return None


class EventKind(StrEnum):
    """The kinds of lines in ``events.jsonl``."""

    STATE = "state"
    STEP = "step"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    DONE = "done"
    ERROR = "error"
    CALIBRATION = "calibration"
    FIT = "fit"
    EXPORT = "export"
    EXPORTED = "exported"
    HOLD = "hold"


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


# The shape of each kind of event. Optional fields live in a ``total=False`` subclass of the required ones: Python
# 3.11 does not see ``NotRequired`` in the string annotations of ``from __future__ import annotations``.
class _Stamped(TypedDict):
    ts: float
    seq: int


class _StateFields(_Stamped):
    event: Literal[EventKind.STATE]
    state: str


class StateEvent(_StateFields, total=False):
    """A phase of the job (``state`` is a :class:`JobState`; a newer payload may send one this app does not know).

    A ``failed`` state may say why (``reason``) and, when it is no failure, what stopped it (``stopped_by``, a
    :class:`StopCause`) and the step of the checkpoint it saved on the way out (``checkpoint_step``; missing when
    none was saved, and in files written before it existed: readers fall back to the newest checkpoint event); the
    bootstrap's last state says ``ready: true``. The payload adds details such as ``detail`` or ``step``: free
    fields.
    """

    reason: str | None
    stopped_by: str | None
    checkpoint_step: int | None
    ready: bool | None


class _StepFields(_Stamped):
    event: Literal[EventKind.STEP]
    step: int
    loss: float


class StepEvent(_StepFields, total=False):
    """A logged training step; GPU readings and ``tokens`` are free fields.

    A preference objective (DPO, ORPO) adds its rewards over the step's pairs: the chosen and rejected answers'
    (``reward_chosen``, ``reward_rejected``), their mean difference (``reward_margin``) and the share of pairs whose
    chosen answer is rewarded more (``reward_accuracy``, 0 to 1).
    """

    total_steps: int | None
    epoch: float | None
    lr: float | None
    tokens_per_s: float | None
    reward_chosen: float | None
    reward_rejected: float | None
    reward_margin: float | None
    reward_accuracy: float | None


class _EvalFields(_Stamped):
    event: Literal[EventKind.EVAL]
    step: int
    eval_loss: float


class EvalEvent(_EvalFields, total=False):
    """An evaluation's loss at a step.

    A preference objective adds the held-out pairs' ``reward_margin`` and ``reward_accuracy`` (as in
    :class:`StepEvent`).
    """

    reward_margin: float | None
    reward_accuracy: float | None


class CheckpointEvent(_Stamped):
    """A sealed checkpoint: its folder under the output folder, its size and each file's SHA-256."""

    event: Literal[EventKind.CHECKPOINT]
    step: int
    path: str
    bytes: int
    sha256: dict[str, str]


class _DoneFields(_Stamped):
    event: Literal[EventKind.DONE]
    adapter_path: str
    files: dict[str, str]


class DoneEvent(_DoneFields, total=False):
    """The adapter (or model) is saved and sealed: its folder and each file's SHA-256."""

    bytes: int | None
    train_seconds: float | None
    wall_seconds: float | None
    metrics: dict[str, Any] | None


class _ErrorFields(_Stamped):
    event: Literal[EventKind.ERROR]
    kind: str
    message: str


class ErrorEvent(_ErrorFields, total=False):
    """Why the job failed: an :class:`ErrorKind` as ``kind``, the message and a hint to fix it.

    An out-of-memory error carries the GPU's measured peak (``peak_gpu_gb``, None without a GPU).
    """

    hint: str | None
    peak_gpu_gb: float | None


class _CalibrationFields(_Stamped):
    event: Literal[EventKind.CALIBRATION]
    step: int
    micro_batch: int
    grad_accum: int
    seq_len: int
    seconds_per_step: float


class CalibrationEvent(_CalibrationFields, total=False):
    """The first steps of the real job, measured once.

    Measured over ``calibration_steps`` or ``calibration_minutes``, whichever comes first: seconds per optimizer step,
    tokens per second and peak GPU memory in GB (None without a GPU), with the setup measured (after any fit).
    """

    steps: int | None
    gradient_checkpointing: bool | None
    tokens_per_s: float | None
    peak_allocated_gb: float | None
    peak_reserved_gb: float | None


class _FitFields(_Stamped):
    event: Literal[EventKind.FIT]
    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    reason: str


class FitEvent(_FitFields, total=False):
    """The job did not fit in its first steps and is tried again with less memory.

    The new micro-batch and accumulation (the same effective batch; sequence length and data are never changed) and
    whether activation checkpointing is on, and why.
    """

    peak_allocated_gb: float | None
    attempt: int | None


class _ExportFields(_Stamped):
    event: Literal[EventKind.EXPORT]
    phase: str


class ExportEvent(_ExportFields, total=False):
    """The export on the machine (after training) is at ``phase`` (merging, converting...), ``fraction`` done."""

    fraction: float | None


class _ExportedFields(_Stamped):
    event: Literal[EventKind.EXPORTED]
    files: dict[str, str]


class ExportedEvent(_ExportedFields, total=False):
    """The export on the machine ended: its files (paths relative to ``out/``, sha256 each), or why it failed.

    ``outputs`` maps each output asked for (``merged``, ``gguf:Q8_0``) to its path relative to ``out/``;
    ``merge_check`` is how closely the merged model's logits matched base + adapter; ``notes`` says what to know
    (tensors the converter wrote in another type).
    """

    outputs: dict[str, str] | None
    merge_check: dict[str, Any] | None
    notes: list[str] | None
    error: str | None


class _HoldFields(_Stamped):
    event: Literal[EventKind.HOLD]
    step: int
    held: bool


class HoldEvent(_HoldFields, total=False):
    """Every rank holds at the end of ``step`` while the user decides (``held`` true), or the hold ended (false).

    The end says how (``outcome``, a :class:`HoldOutcome`) and after how many ``seconds``.
    """

    outcome: str | None
    seconds: float | None


Event = (
    StateEvent
    | StepEvent
    | EvalEvent
    | CheckpointEvent
    | DoneEvent
    | ErrorEvent
    | CalibrationEvent
    | FitEvent
    | ExportEvent
    | ExportedEvent
    | HoldEvent
)
#: The shape of each kind of event: the one source of the fields :func:`validate_event` checks.
EVENT_TYPES: dict[EventKind, type[Any]] = {
    EventKind.STATE: StateEvent,
    EventKind.STEP: StepEvent,
    EventKind.EVAL: EvalEvent,
    EventKind.CHECKPOINT: CheckpointEvent,
    EventKind.DONE: DoneEvent,
    EventKind.ERROR: ErrorEvent,
    EventKind.CALIBRATION: CalibrationEvent,
    EventKind.FIT: FitEvent,
    EventKind.EXPORT: ExportEvent,
    EventKind.EXPORTED: ExportedEvent,
    EventKind.HOLD: HoldEvent,
}
_STAMP_FIELDS = frozenset({"ts", "seq", "event"})


def _json_types(declared: Any) -> tuple[type, ...]:
    """The JSON value types a field's annotation allows, besides null (a ``float`` may be written as a whole number)."""
    arms = typing.get_args(declared) if typing.get_origin(declared) in (typing.Union, types.UnionType) else (declared,)
    found: list[type] = []
    for arm in arms:
        if arm is not type(None):
            base = typing.get_origin(arm) or arm
            found.extend((int, float) if base is float else (base,))
    return tuple(found)


def _field_table(optional: bool) -> dict[EventKind, dict[str, tuple[type, ...]]]:
    """Each kind's required (or optional) fields beyond ``ts``, ``seq`` and ``event``, with their JSON types."""
    table = {}
    for kind, shape in EVENT_TYPES.items():
        hints = typing.get_type_hints(shape)
        names = shape.__optional_keys__ if optional else shape.__required_keys__ - _STAMP_FIELDS
        table[kind] = {name: _json_types(declared) for name, declared in hints.items() if name in names}
    return table


_NUMBER = (int, float)
#: The times an event's ``ts`` may have, seconds since 1970 (2001-09-09 to 2099-12-04): a machine's clock may be off
#: by minutes, not by centuries, and a reader's arithmetic on times must never overflow.
TS_RANGE = (1e9, 4.1e9)
#: The largest size of any number in an event: no step, byte count, loss or reading of ours comes near it.
MAX_MAGNITUDE = 1e15
#: The largest ``seq``: above it, a reader that keeps numbers as doubles loses whole numbers.
MAX_SEQ = 2**53
# The fields each kind of event must carry, and their JSON types; other fields are free.
_REQUIRED_FIELDS = _field_table(optional=False)
# Fields that may be missing or null, and their JSON types when present.
_OPTIONAL_FIELDS = _field_table(optional=True)
_HEX = frozenset("0123456789abcdef")


def validate_event(obj: object) -> Event:
    """Checks a decoded event line against the protocol and returns it, its ``event`` made an :class:`EventKind`.

    Every event has a ``ts`` within :data:`TS_RANGE`, a whole ``seq`` from 1 to :data:`MAX_SEQ` and a known
    ``event``; each kind has its fields (see :data:`EVENT_TYPES`). Every number anywhere in it, free fields and
    nested ones included, is finite and at most :data:`MAX_MAGNITUDE` in size. File names in ``checkpoint`` and
    ``done`` events must be plain relative paths.

    Raises:
        UnsafePathError: A file name could leave its folder.
        EventError: The line is not a valid event; the message names the field.
    """
    if not isinstance(obj, dict):
        raise EventError("an event must be a JSON object")
    _check_field(obj, "ts", _NUMBER)
    _check_field(obj, "seq", (int,))
    _check_field(obj, "event", (str,))
    if not TS_RANGE[0] <= obj["ts"] <= TS_RANGE[1]:  # NaN compares false: refused too
        raise EventError(f"ts {_shown(obj['ts'])} must be seconds since 1970 from 1e9 to 4.1e9 (2001 to 2099)")
    if not 1 <= obj["seq"] <= MAX_SEQ:
        raise EventError(f"seq {_shown(obj['seq'])} must be from 1 to 2**53")
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
    elif kind is EventKind.EXPORTED:
        _check_digests(obj["files"])
        for path in (obj.get("outputs") or {}).values():
            check_relative_path(str(path))
    _check_numbers(kind, obj)
    obj["event"] = kind
    return typing.cast(Event, obj)


def _check_field(obj: dict[str, Any], name: str, types: tuple[type, ...]) -> None:
    value = obj.get(name)
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):  # JSON true is no number
        wanted = " or ".join(t.__name__ for t in types)
        raise EventError(f"{obj.get('event', 'event')} field {name!r} must be {wanted}, not {_shown(value)}")


def _check_numbers(kind: EventKind, obj: dict[str, Any]) -> None:
    """Refuses an event holding, anywhere, a number that is not finite or larger than :data:`MAX_MAGNITUDE`.

    ``ts`` and ``seq`` have ranges of their own, checked before.

    Raises:
        EventError: The message names the field (``metrics.loss``, ``gpus[1]``) and its value.
    """
    pending: list[tuple[str, object]] = [(name, value) for name, value in obj.items() if name not in ("ts", "seq")]
    while pending:  # a loop, not recursion: nesting as deep as the JSON parser allows costs no stack
        where, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((f"{where}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((f"{where}[{index}]", item) for index, item in enumerate(value))
        elif isinstance(value, int | float) and not isinstance(value, bool) and not abs(value) <= MAX_MAGNITUDE:
            raise EventError(
                f"{kind.value} field {where[:80]!r} must be a finite number of at most 1e15 in size, "
                f"not {_shown(value)}"
            )


def _shown(value: object) -> str:
    """A value as the line had it, cut short (``NaN`` and ``Infinity`` as JSON readers write them)."""
    return json.dumps(value, default=str)[:60]


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


def path_inside(root: Path, relative: str) -> Path:
    """``root / relative`` resolved, when ``relative`` is a safe relative path that stays inside ``root`` (resolved).

    Raises:
        UnsafePathError: ``relative`` is not a plain relative path, or a link leads it out of ``root``.
    """
    target = (root / check_relative_path(relative)).resolve()
    if root not in target.parents:
        raise UnsafePathError(f"{relative!r} (it leads out of its folder)")
    return target


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

    events: list[Event]
    used: int
    skipped: list[str]


def parse_event_chunk(data: bytes, *, limit: int | None = None, skip_unsafe: bool = False) -> EventChunk:
    """Parses and validates the complete lines of a chunk; a torn or malformed line is skipped, not fatal.

    This is the one parser of events, for the machine's stream and for the files on either side alike.

    Args:
        data: Bytes of ``events.jsonl`` from a line start; a last line without its newline is left unused.
        limit: The most bytes the caller reads at once: a chunk that long without a newline is one line longer
            than any event of ours, and is skipped whole so the reader moves on.
        skip_unsafe: Skip an event naming an unsafe file like any invalid line, instead of raising: for a file
            that only ever held validated events (a local mirror), where such a line is damage, not an attack.

    Raises:
        UnsafePathError: A line is a well-formed event naming an unsafe file (the sender is not to be trusted).
    """
    end = data.rfind(b"\n") + 1
    if not end and limit is not None and len(data) >= limit:
        return EventChunk([], len(data), [f"a line longer than {limit} bytes"])
    events: list[Event] = []
    skipped: list[str] = []
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            events.append(validate_event(json.loads(line)))
        except UnsafePathError:
            if not skip_unsafe:
                raise
            skipped.append(f"an unsafe file name in {line[:80]!r}")
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8 and protocol errors alike
            skipped.append(f"{str(exc)[:200]} in {line[:80]!r}")
    return EventChunk(events, end, skipped)


@dataclass(frozen=True)
class EventTail:
    """Events read from a file of events after a byte offset.

    Attributes:
        events: The valid events of the complete lines read, in order.
        offset: Where the next read starts (after the last complete line, or after a skipped over-long line).
        more: Whether the file holds more bytes than were read (the read was limited).
        restarted: The file was shorter than the offset (it was replaced), so it was read from its start.
        skipped: Why each torn, malformed or over-long line was skipped.
    """

    events: list[Event]
    offset: int
    more: bool
    restarted: bool = False
    skipped: list[str] = field(default_factory=list)


def read_event_file(path: Path, offset: int = 0, limit: int | None = None) -> EventTail:
    """Reads the events of the complete lines after byte ``offset`` (at most ``limit`` bytes); blocking.

    A file shorter than ``offset`` was replaced: it is read again from its start. A single line longer than
    ``limit`` is no event of ours: it is skipped, so the reader moves on. Unsafe file names are skipped, not raised:
    the files read this way are this computer's own (see :func:`parse_event_chunk`). A missing file has no events.
    """
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            restarted = size < offset
            start = 0 if restarted else offset
            handle.seek(start)
            data = handle.read(-1 if limit is None else limit)
    except FileNotFoundError:
        return EventTail([], 0, more=False, restarted=offset > 0)
    chunk = parse_event_chunk(data, limit=limit, skip_unsafe=True)
    return EventTail(chunk.events, start + chunk.used, start + len(data) < size, restarted, chunk.skipped)


METHODS = ("qlora", "lora", "full", "full-8bit")
#: What the training optimises: supervised fine-tuning on chats, a preference objective on prompt / chosen /
#: rejected pairs (DPO against a reference model, ORPO without one), or continued pre-training on raw text.
OBJECTIVES = ("sft", "dpo", "orpo", "cpt")
PREFERENCE_OBJECTIVES = frozenset({"dpo", "orpo"})
#: DPO's losses offered (TRL's names): the sigmoid loss of the DPO paper, IPO, the hinge loss of SLiC, robust DPO.
DPO_LOSSES = ("sigmoid", "ipo", "hinge", "robust")
ENGINES = ("trl", "unsloth")
#: Where a run's metrics go besides the event stream (transformers' ``report_to``): TensorBoard event files and
#: trackio's database, written on the machine and carried home inside every sealed checkpoint and the adapter, and
#: Weights & Biases, sent from the machine to the user's W&B account (its key reaches the trainer over stdin).
TRACKERS = ("tensorboard", "trackio", "wandb")
#: The trackers whose logs are files in the output folder, each in its folder, copied into every sealed checkpoint.
TRACKER_DIR_NAMES = {"tensorboard": "tensorboard", "trackio": "trackio"}
#: The TensorBoard event files' folder: in the output folder, and a copy inside each sealed checkpoint.
TENSORBOARD_DIR_NAME = TRACKER_DIR_NAMES["tensorboard"]
#: trackio's folder (its ``TRACKIO_DIR``): one SQLite database per project, copied whole into each checkpoint.
TRACKIO_DIR_NAME = TRACKER_DIR_NAMES["trackio"]
#: The project a run's metrics go under in trackio and W&B unless the spec names one.
DEFAULT_TRACKING_PROJECT = "rentune"
_TRACKING_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
STRATEGIES = ("ddp", "fsdp")
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")


# -- preference pairs: read the same way by the app's data check and by the payload ----------------------------------

#: The roles a chat message may have.
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
Pair = dict[str, Any]


class PairProblem(StrEnum):
    """Why a row is not a usable preference pair."""

    SHAPE = "shape"  # not an object, a field of the wrong type, an unknown role, no answer at the end
    MISSING = "missing"  # the chosen or the rejected side is missing
    EMPTY = "empty"  # an answer is empty
    PROMPT_DIFFERS = "prompt-differs"  # two whole conversations that differ before their answers


class PairError(ValueError):
    """A row is not a usable pair: ``problem`` says which kind, the message what exactly."""

    def __init__(self, problem: PairProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


def is_pair_row(row: object) -> bool:
    """Whether a decoded row is laid out as a preference pair: it names a ``chosen`` or a ``rejected`` side.

    A pair missing one side is still a pair (a defective one).
    """
    return isinstance(row, dict) and ("chosen" in row or "rejected" in row)


def _pair_messages(value: Any, side: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise PairError(PairProblem.SHAPE, f"'{side}' must be text or a non-empty list of messages")
    for index, message in enumerate(value, start=1):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise PairError(
                PairProblem.SHAPE, f"'{side}' message {index} needs a role of system, user, assistant or tool"
            )
        if not isinstance(message.get("content"), str):
            raise PairError(PairProblem.SHAPE, f"'{side}' message {index} needs string content")
    return value


def _pair_answer(messages: list[dict[str, str]], side: str) -> list[dict[str, str]]:
    if messages[-1]["role"] != "assistant":
        raise PairError(PairProblem.SHAPE, f"'{side}' must end with the assistant's answer")
    if not messages[-1]["content"].strip():
        raise PairError(PairProblem.EMPTY, f"the {side} answer is empty")
    return messages


def _plain_pair(row: dict[str, Any]) -> Pair:
    prompt, chosen, rejected = row.get("prompt", ""), row["chosen"], row["rejected"]
    if not isinstance(prompt, str):
        raise PairError(PairProblem.SHAPE, "'prompt' must be text when the answers are text")
    for side, text in (("chosen", chosen), ("rejected", rejected)):
        if not text.strip():
            raise PairError(PairProblem.EMPTY, f"the {side} answer is empty")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _after_prompt(prompt: list[dict[str, str]], answer: list[dict[str, str]]) -> list[dict[str, str]]:
    """The answer without the prompt's turns, when it repeats them first (a whole conversation per side)."""
    return answer[len(prompt) :] if len(answer) > len(prompt) and answer[: len(prompt)] == prompt else answer


def _chat_pair(row: dict[str, Any]) -> Pair:
    chosen = _pair_answer(_pair_messages(row["chosen"], "chosen"), "chosen")
    rejected = _pair_answer(_pair_messages(row["rejected"], "rejected"), "rejected")
    if "prompt" in row:
        # UltraFeedback's binarised rows give the prompt as text and each answer as the whole conversation.
        given = row["prompt"]
        prompt = [{"role": "user", "content": given}] if isinstance(given, str) else _pair_messages(given, "prompt")
        return {"prompt": prompt, "chosen": _after_prompt(prompt, chosen), "rejected": _after_prompt(prompt, rejected)}
    if chosen[:-1] != rejected[:-1]:
        raise PairError(
            PairProblem.PROMPT_DIFFERS,
            "the conversations differ before their answers: chosen and rejected need the same prompt",
        )
    if len(chosen) < 2:
        raise PairError(
            PairProblem.SHAPE, "each conversation needs the prompt before its answer, or give 'prompt' on its own"
        )
    return {"prompt": chosen[:-1], "chosen": chosen[-1:], "rejected": rejected[-1:]}


def pair_from_row(row: object) -> Pair:
    """The pair of one decoded row in TRL's ``prompt`` / ``chosen`` / ``rejected`` shape.

    Rows take TRL's shapes, as plain text or chat messages: ``prompt`` / ``chosen`` / ``rejected`` (an answer that
    repeats the prompt's turns first, as UltraFeedback's binarised rows do, has them taken off), or ``chosen`` /
    ``rejected`` alone as whole conversations sharing their turns before the answer.

    Raises:
        PairError: The row is not a usable pair; its ``problem`` and message say why.
    """
    if not isinstance(row, dict):
        raise PairError(PairProblem.SHAPE, "expected an object with 'chosen' and 'rejected'")
    missing = [side for side in ("chosen", "rejected") if row.get(side) is None]
    if missing:
        raise PairError(PairProblem.MISSING, f"the {' and '.join(missing)} side is missing")
    if isinstance(row["chosen"], str) and isinstance(row["rejected"], str):
        return _plain_pair(row)
    return _chat_pair(row)


def pair_form(pair: Pair) -> str:
    """``plain text`` or ``chat messages``: a file's pairs must all take one form."""
    return "plain text" if isinstance(pair["chosen"], str) else "chat messages"


def _as_messages(value: str | list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def pair_prompt(pair: Pair) -> list[dict[str, Any]]:
    """A pair's prompt as chat messages (plain text as the user's message; none for a pair without prompt)."""
    return _as_messages(pair["prompt"], "user") if pair["prompt"] else []


def pair_answer(pair: Pair, side: str) -> list[dict[str, Any]]:
    """One side's answer (``chosen`` or ``rejected``) as chat messages (plain text as the assistant's message)."""
    return _as_messages(pair[side], "assistant")


def precomputes_reference(objective: str, method: str, max_steps: int) -> bool:
    """Whether DPO computes its reference model's log-probabilities once, before the first step.

    Beside a full fine-tune the reference is a frozen copy of the model: computed once over every pair instead, it
    needs no second copy in memory and no reference forward pass per step. A run capped at ``max_steps`` (a quick
    trial) keeps the copy: a pass over all the pairs could cost more than the capped run. With an adapter the base
    with the adapter switched off is the reference: nothing to compute ahead.
    """
    return objective == "dpo" and method.startswith("full") and max_steps <= 0


def sharded_checkpoints(method: str, strategy: str) -> bool:
    """Whether a job's checkpoints are sharded (each rank writes its part) rather than whole on rank 0.

    Under FSDP a full fine-tune's are sharded: gathering a large model and its optimizer state to one rank would take
    its host memory and time. An adapter is small: gathering it costs little, and its checkpoints are then adapters
    that can be exported. Across machines every machine then holds a part of each checkpoint: the app brings them
    all home and sends them all to every machine on a resume.
    """
    return strategy == "fsdp" and method.startswith("full")


@dataclass(frozen=True)
class JobSpec:
    """What to train and how (``job.json``). Relative paths are relative to the job file.

    The keys are fixed by the protocol; see the field names. ``epochs`` is used when ``max_steps`` is 0 or less.
    With an ``eval_file``, the held-out loss is measured every ``eval_steps`` steps, or after each tenth of the run
    when ``eval_steps`` is 0. The first ``calibration_steps`` optimizer steps (or ``calibration_minutes``, whichever
    ends first; 0 steps: none) are measured into one ``calibration`` event; an out-of-memory error before that is
    met by halving the micro-batch (doubling the accumulation), down to 1 with activation checkpointing on.
    Across several machines (``num_nodes`` above 1) every node gets the same job but its own ``node_rank``; rank 0's
    machine is the head, reached by the others at ``head_address``:``head_port``. ``report_to`` (:data:`TRACKERS`)
    writes TensorBoard event files and trackio's database into the output folder (:data:`TRACKER_DIR_NAMES`), copied
    into every sealed checkpoint and the adapter so they come home verified with them; ``wandb`` sends the metrics to
    W&B (``wandb_url`` for a server of one's own), the key read from stdin. Trackers name the run ``run_name`` in
    ``tracking_project``.
    """

    base_model: str
    train_file: str
    output_dir: str
    version: int = PROTOCOL_VERSION
    eval_file: str | None = None
    method: str = "qlora"
    objective: str = "sft"
    beta: float = 0.1
    loss_type: str = "sigmoid"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"
    seq_len: int = 2048
    micro_batch: int = 2
    grad_accum: int = 4
    epochs: float = 3.0
    max_steps: int = 0
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
    num_nodes: int = 1
    node_rank: int = 0
    head_address: str = ""
    head_port: int = 29500
    gradient_checkpointing: bool = True
    eval_steps: int = 0
    calibration_steps: int = 20
    calibration_minutes: float = 2.0
    idle_stop_minutes: float = 0.0
    report_to: list[str] = field(default_factory=list)
    tracking_project: str = DEFAULT_TRACKING_PROJECT
    run_name: str = ""
    wandb_url: str = ""
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
        _choice("objective", self.objective, OBJECTIVES)
        _choice("loss_type", self.loss_type, DPO_LOSSES)
        _choice("engine", self.engine, ENGINES)
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("lr_scheduler", self.lr_scheduler, SCHEDULERS)
        for key, (low, high) in JOB_INT_RANGES.items():
            _int_range(key, getattr(self, key), low, high)
        self._validate_nodes()
        if not (self.max_steps > 0 or 0 < self.epochs <= 1000):
            raise JobSpecError("set max_steps above 0, or epochs above 0 (at most 1000)")
        if not 0 < self.learning_rate < 1:
            raise JobSpecError(f"learning_rate {self.learning_rate} must be above 0 and below 1")
        if not 0 <= self.lora_dropout < 1:
            raise JobSpecError(f"lora_dropout {self.lora_dropout} must be at least 0 and below 1")
        if not 0 < self.beta <= 10:
            raise JobSpecError(f"beta {self.beta} must be above 0 and at most 10 (DPO and ORPO use about 0.1)")
        self._validate_tracking()
        if self.objective in PREFERENCE_OBJECTIVES and self.engine != "trl":
            raise JobSpecError(f'objective "{self.objective}" trains with TRL: set engine "trl"')
        if self.checkpoint_minutes < 0 or self.idle_stop_minutes < 0 or self.calibration_minutes < 0:
            raise JobSpecError("checkpoint_minutes, idle_stop_minutes and calibration_minutes must not be negative")
        if not (
            self.target_modules == "all-linear"
            or (isinstance(self.target_modules, list) and all(isinstance(m, str) for m in self.target_modules))
        ):
            raise JobSpecError('target_modules must be "all-linear" or a list of module names')

    def _validate_tracking(self) -> None:
        for tracker in self.report_to:
            if tracker not in TRACKERS:
                raise JobSpecError(f"report_to {tracker!r}: runs report to {', '.join(TRACKERS)}")
        for key in ("tracking_project", "run_name"):
            value = getattr(self, key)
            if not _TRACKING_NAME.fullmatch(value) and (value or key == "tracking_project"):
                raise JobSpecError(
                    f"{key} {value!r} must be 1 to 64 letters, digits, '-', '_' or '.' (trackio and W&B name runs so)"
                )
        if self.wandb_url and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", self.wandb_url):
            raise JobSpecError(f"wandb_url {self.wandb_url!r} must be an http(s) address, like https://api.wandb.ai")

    def _validate_nodes(self) -> None:
        """Several machines: this one's rank among them, and the head every rank reaches (an address, no more)."""
        if self.node_rank >= self.num_nodes:
            raise JobSpecError(f"node_rank {self.node_rank} must be below num_nodes {self.num_nodes}")
        if self.num_nodes > 1 and not _HOST_ADDRESS.fullmatch(self.head_address):
            raise JobSpecError(
                f"head_address {self.head_address!r} must be the head node's IP address or host name when "
                f"num_nodes is {self.num_nodes}"
            )

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


#: A host name or an IPv4/IPv6 address: what ``accelerate launch --main_process_ip`` is given (no spaces, no options).
_HOST_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")


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
    "num_nodes": (1, 64),
    "node_rank": (0, 63),
    "head_port": (1024, 65535),
    "keep_checkpoints": (1, 1000),
    "checkpoint_steps": (0, 10**9),
    "seed": (0, 2**32 - 1),
    "eval_steps": (0, 10**9),
    "calibration_steps": (0, 10**6),
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

    Lines are strict JSON: a number that is not finite (a diverged loss, an unreadable GPU sensor) is written as
    ``null``. In an optional or free field that is all; in a required one (a step's ``loss``, an eval's
    ``eval_loss``) readers skip the line as malformed, naming the field, and go on with the next.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._seq = _last_seq(path)
        self._torn = _ends_mid_line(path)

    def emit(self, kind: EventKind, /, **fields_: Any) -> dict[str, Any]:
        """Writes one event and returns it (``fields_`` may hold a ``kind`` of its own, as error events do)."""
        self._seq += 1
        event: dict[str, Any] = finite({"ts": round(time.time(), 3), "seq": self._seq, "event": kind.value, **fields_})
        line = (json.dumps(event, default=str, allow_nan=False) + "\n").encode("utf-8")
        if self._torn:
            line = b"\n" + line
        with self.path.open("ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self._torn = False
        return event


def finite(value: Any) -> Any:
    """``value`` with every number that is not finite (NaN, infinity), at any depth, made ``None``.

    Mappings become dicts and tuples lists, as JSON writes them anyway; anything else is returned as it is.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def _last_seq(path: Path) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    # A last line without its newline counts: the next event ends it first, so it becomes a line of its own.
    events = parse_event_chunk(data + b"\n", skip_unsafe=True).events
    return max((event["seq"] for event in events), default=0)


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
