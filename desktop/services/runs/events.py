"""The run's event stream as mirrored on this computer: reading, appending, the final word, wording for people.

The mirror (``events.jsonl`` in the run folder) is append-only and fsynced; every line is validated by the shared
protocol before it is kept, so a torn or hostile line never reaches a reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from trainer_payload.protocol import EVENTS_FILE_NAME, EventError, EventKind, JobState, validate_event


def mirrored_events(folder: Path) -> list[dict[str, Any]]:
    """The run's events as mirrored on this computer: valid lines only, each seq once, in order."""
    try:
        data = (folder / EVENTS_FILE_NAME).read_bytes()
    except FileNotFoundError:
        return []
    return ascending(valid_events(data.splitlines()), 0)


def valid_events(lines: list[bytes]) -> list[dict[str, Any]]:
    """The lines that are valid events; a torn or malformed line is skipped."""
    events = []
    for line in lines:
        try:
            events.append(validate_event(json.loads(line)))
        except (EventError, ValueError, RecursionError):
            continue
    return events


def ascending(events: list[dict[str, Any]], after: int) -> list[dict[str, Any]]:
    """The events whose seq is above ``after`` and above every seq before them (repeats and strays dropped)."""
    kept, last = [], after
    for event in events:
        if event["seq"] > last:
            kept.append(event)
            last = event["seq"]
    return kept


def append_mirror(folder: Path, events: list[dict[str, Any]]) -> int:
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
    lines = tail[:end].splitlines()[1 if start else 0 :]  # the first line of a window may be cut
    events = valid_events(lines)
    return max((event["seq"] for event in events), default=0)


def final_event(folder: Path) -> dict[str, Any] | None:
    """The trainer's last word when it ended the job (``done``, or the ``failed`` state), else None."""
    events = mirrored_events(folder)
    last = events[-1] if events else None
    if last is not None and last["event"] == EventKind.STATE and last.get("state") == JobState.DONE:
        last = next((e for e in reversed(events) if e["event"] == EventKind.DONE), None)
    failed = last is not None and last["event"] == EventKind.STATE and last.get("state") == JobState.FAILED
    if last is not None and (last["event"] == EventKind.DONE or failed):
        return last
    return None


def newest_checkpoint_only(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drops checkpoint events followed by a newer one in the same batch: only the newest is worth pulling."""
    last = max((i for i, e in enumerate(events) if e["event"] == EventKind.CHECKPOINT), default=-1)
    return [e for i, e in enumerate(events) if e["event"] != "checkpoint" or i == last]


def describe_event(event: dict[str, Any]) -> str:
    """One event as a line for people (what the machine sent is shown, never obeyed: escapes stay visible)."""
    text = _event_text(event)
    return "".join(char if char == "\n" or char.isprintable() else repr(char)[1:-1] for char in text)


def _event_text(event: dict[str, Any]) -> str:
    kind = event["event"]
    if kind == "step":
        rate = event.get("tokens_per_s")
        return f"step {event['step']}: loss {event['loss']:.4f}" + (f", {rate:,.0f} tok/s" if rate else "")
    if kind == "state":
        return f"[{event['state']}] " + " ".join(
            f"{k}={v}" for k, v in event.items() if k not in {"ts", "seq", "event", "state"} and v is not None
        )
    if kind == "error":
        return f"error ({event.get('kind')}): {event.get('message')}\n  hint: {event.get('hint')}"
    if kind == "checkpoint":
        return f"checkpoint at step {event['step']} ({event['bytes'] / 1e6:,.1f} MB)"
    if kind == "done":
        return f"done in {event.get('train_seconds')} s of training"
    return json.dumps(event)
