"""The run's event stream as mirrored on this computer: reading, appending, the final word, wording for people.

The mirror (``events.jsonl`` in the run folder) is append-only and fsynced; every line is validated by the shared
protocol before it is kept, so a torn or hostile line never reaches a reader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from desktop.core.units import memory_text
from trainer_payload.protocol import (
    EVENTS_FILE_NAME,
    Event,
    EventKind,
    JobState,
    parse_event_chunk,
    read_event_file,
)


def mirrored_events(folder: Path) -> list[Event]:
    """The run's events as mirrored on this computer: valid lines only, each seq once, in order."""
    return ascending(read_event_file(folder / EVENTS_FILE_NAME).events, 0)


def ascending(events: Sequence[Event], after: int) -> list[Event]:
    """The events whose seq is above ``after`` and above every seq before them (repeats and strays dropped)."""
    kept, last = [], after
    for event in events:
        if event["seq"] > last:
            kept.append(event)
            last = event["seq"]
    return kept


def append_mirror(folder: Path, events: Sequence[Event]) -> int:
    """Appends to the local mirror the events it lacks (by seq), fsynced; returns the mirror's last seq.

    A torn last line (this computer died mid-write) is cut off first, so the new lines start clean.
    """
    with (folder / EVENTS_FILE_NAME).open("a+b") as mirror:
        last = _repaired_last_seq(mirror)
        fresh = ascending(events, last)
        if fresh:
            mirror.write(b"".join(json.dumps(e).encode("utf-8") + b"\n" for e in fresh))
            mirror.flush()
            os.fsync(mirror.fileno())
    return fresh[-1]["seq"] if fresh else last


def _repaired_last_seq(mirror: IO[bytes], window: int = 1 << 16) -> int:
    """The seq of the mirror's last valid event, after cutting off a torn last line."""
    size = mirror.seek(0, os.SEEK_END)
    start = max(0, size - window)
    mirror.seek(start)
    tail = mirror.read()
    end = tail.rfind(b"\n") + 1
    if end < len(tail) and (end or not start):
        mirror.truncate(start + end)
    elif end < len(tail):
        mirror.write(b"\n")  # a last line longer than the window: end it, readers skip it
    lines = tail[:end]
    if start:
        lines = lines[lines.find(b"\n") + 1 :]  # the first line of a window may be cut
    events = parse_event_chunk(lines, skip_unsafe=True).events
    return max((event["seq"] for event in events), default=0)


def final_event(folder: Path) -> Event | None:
    """The trainer's last word when it ended the job (``done``, or the ``failed`` state), else None.

    The export on the machine writes after the trainer's ``done``: its events are not the trainer's words.
    """
    events = [e for e in mirrored_events(folder) if e["event"] not in (EventKind.EXPORT, EventKind.EXPORTED)]
    last = events[-1] if events else None
    if last is not None and last["event"] is EventKind.STATE and last["state"] == JobState.DONE:
        last = next((e for e in reversed(events) if e["event"] is EventKind.DONE), None)
    if last is None or last["event"] is EventKind.DONE:
        return last
    if last["event"] is EventKind.STATE and last["state"] == JobState.FAILED:
        return last
    return None


def newest_checkpoint_only(events: Sequence[Event]) -> list[Event]:
    """Drops checkpoint events followed by a newer one in the same batch: only the newest is worth pulling."""
    last = max((i for i, e in enumerate(events) if e["event"] is EventKind.CHECKPOINT), default=-1)
    return [e for i, e in enumerate(events) if e["event"] is not EventKind.CHECKPOINT or i == last]


class EventLine(str):
    """A report line that only retells one of the trainer's events.

    A reader of the run's event file (the monitor) already has the event itself and words it its own way; it skips
    these lines. Everywhere else (the CLI) they are plain lines.
    """

    __slots__ = ()


def describe_event(event: Mapping[str, Any]) -> str:
    """One event as a line for people (what the machine sent is shown, never obeyed: escapes stay visible)."""
    text = _event_text(event)
    return "".join(char if char == "\n" or char.isprintable() else repr(char)[1:-1] for char in text)


def _event_text(event: Mapping[str, Any]) -> str:
    words = _TERMINAL_WORDS.get(str(event["event"]))
    return words(event) if words is not None else json.dumps(event)


def _step_words(event: Mapping[str, Any]) -> str:
    rate = event.get("tokens_per_s")
    speed = f", {rate:,.0f} tok/s" if rate else ""
    return f"step {event['step']}: loss {event['loss']:.4f}" + _preference_words(event) + speed


def _eval_words(event: Mapping[str, Any]) -> str:
    return f"held-out loss {event['eval_loss']:.4f} at step {event['step']}" + _preference_words(event)


def _preference_words(event: Mapping[str, Any]) -> str:
    """A preference objective's rewards (DPO, ORPO): how often the chosen answer wins, and by how much."""
    accuracy, margin = event.get("reward_accuracy"), event.get("reward_margin")
    if not isinstance(accuracy, int | float) or isinstance(accuracy, bool):
        return ""
    by = f", margin {margin:+.3f}" if isinstance(margin, int | float) and not isinstance(margin, bool) else ""
    return f", chosen preferred {accuracy:.0%}{by}"


def _done_words(event: Mapping[str, Any]) -> str:
    metrics = event.get("metrics")
    base, tuned = (
        (metrics.get("base_perplexity"), metrics.get("perplexity")) if isinstance(metrics, Mapping) else (None, None)
    )
    text = f"done in {event.get('train_seconds')} s of training"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (base, tuned)):
        text += f"; held-out perplexity {base:,.2f} before training, {tuned:,.2f} after"
    return text


def _state_words(event: Mapping[str, Any]) -> str:
    details = (f"{k}={v}" for k, v in event.items() if k not in {"ts", "seq", "event", "state"} and v is not None)
    return f"[{event['state']}] " + " ".join(details)


def _calibration_words(event: Mapping[str, Any]) -> str:
    return (
        f"calibrated over {event.get('steps')} steps: {event['seconds_per_step']} s/step, "
        f"{event.get('tokens_per_s')} tok/s, peak {_peak_words(event.get('peak_allocated_gb'))} "
        f"(micro-batch {event['micro_batch']} x {event['grad_accum']})"
    )


def _peak_words(peak: object) -> str:
    """A measured peak in GiB, like every memory figure the app shows; "unknown" when the machine had no GPU."""
    return memory_text(float(peak)) if isinstance(peak, int | float) and not isinstance(peak, bool) else "unknown"


def _fit_words(event: Mapping[str, Any]) -> str:
    return (
        f"out of memory in the first steps: micro-batch {event['micro_batch']} x {event['grad_accum']}, "
        f"checkpointing {'on' if event['gradient_checkpointing'] else 'off'}"
    )


def _exported_words(event: Mapping[str, Any]) -> str:
    if event.get("error"):
        return f"the export on the machine failed: {event['error']}"
    return f"made on the machine: {', '.join(event.get('outputs') or {}) or 'nothing'}"


def _hold_words(event: Mapping[str, Any]) -> str:
    if event.get("held"):
        return f"every rank holds at step {event['step']} while you decide"
    return f"the hold at step {event['step']} ended after {event.get('seconds')} s: {event.get('outcome')}"


#: How the terminal shows each kind of event (others as their JSON).
_TERMINAL_WORDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    EventKind.STEP: _step_words,
    EventKind.EVAL: _eval_words,
    EventKind.STATE: _state_words,
    EventKind.EXPORT: lambda e: f"on the machine: {e.get('phase')}",
    EventKind.EXPORTED: _exported_words,
    EventKind.ERROR: lambda e: f"error ({e.get('kind')}): {e.get('message')}\n  hint: {e.get('hint')}",
    EventKind.CHECKPOINT: lambda e: f"checkpoint at step {e['step']} ({e['bytes'] / 1e6:,.1f} MB)",
    EventKind.DONE: _done_words,
    EventKind.CALIBRATION: _calibration_words,
    EventKind.FIT: _fit_words,
    EventKind.HOLD: _hold_words,
}
