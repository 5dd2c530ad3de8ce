"""The one event parser: every reader of ``events.jsonl`` gets only valid events, whatever the file holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_payload.protocol import EventKind, EventWriter, UnsafePathError, parse_event_chunk, read_event_file


def step(seq: int, **changes: object) -> bytes:
    event = {"ts": 1_760_000_000.0 + seq, "seq": seq, "event": "step", "step": seq, "loss": 1.0 / seq, **changes}
    return json.dumps(event).encode() + b"\n"


def test_a_torn_last_line_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(step(1) + step(2)[:20])
    tail = read_event_file(path)
    assert [e["seq"] for e in tail.events] == [1] and tail.offset == len(step(1)) and not tail.skipped
    path.write_bytes(step(1) + step(2))
    assert [e["seq"] for e in read_event_file(path, tail.offset).events] == [2]


def test_garbage_and_events_with_bad_fields_are_skipped_saying_why(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(step(1) + b"garbage\n" + step(2, loss="low") + b"[1]\n" + step(3, total_steps="9") + step(4))
    tail = read_event_file(path)
    assert [e["seq"] for e in tail.events] == [1, 4] and tail.offset == path.stat().st_size
    assert len(tail.skipped) == 4 and "'loss'" in tail.skipped[1] and "'total_steps'" in tail.skipped[3]


def test_a_line_longer_than_a_read_is_skipped_and_the_reader_moves_on(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"junk": "' + b"x" * 5000 + b'"}\n' + step(1))
    first = read_event_file(path, 0, limit=4096)
    assert first.events == [] and first.offset == 4096 and first.more and "longer than 4096" in first.skipped[0]
    rest = read_event_file(path, first.offset, limit=4096)
    assert [e["seq"] for e in rest.events] == [1] and len(rest.skipped) == 1 and not rest.more


def test_a_file_shorter_than_the_offset_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(step(1) + step(2))
    end = read_event_file(path).offset
    path.write_bytes(step(1))  # replaced by a shorter file
    again = read_event_file(path, end)
    assert again.restarted and [e["seq"] for e in again.events] == [1] and again.offset == len(step(1))
    gone = read_event_file(tmp_path / "missing.jsonl", end)
    assert gone.events == [] and gone.offset == 0 and gone.restarted


def test_an_unsafe_file_name_is_raised_from_a_stream_and_skipped_in_a_file_of_ours(tmp_path: Path) -> None:
    unsafe = {"ts": 1.76e9, "seq": 2, "event": "checkpoint", "step": 1, "path": "../x", "bytes": 1, "sha256": {}}
    data = step(1) + json.dumps(unsafe).encode() + b"\n"
    with pytest.raises(UnsafePathError):
        parse_event_chunk(data)
    assert [e["seq"] for e in parse_event_chunk(data, skip_unsafe=True).events] == [1]
    (tmp_path / "events.jsonl").write_bytes(data)
    tail = read_event_file(tmp_path / "events.jsonl")
    assert [e["seq"] for e in tail.events] == [1] and "unsafe" in tail.skipped[0]


def test_parsed_events_carry_their_kind_as_an_event_kind() -> None:
    (event,) = parse_event_chunk(step(1)).events
    assert event["event"] is EventKind.STEP
    assert json.loads(json.dumps(event))["event"] == "step", "it is still written as its plain name"


def test_a_writer_continues_after_a_complete_event_that_lost_only_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(step(1) + step(2).rstrip(b"\n"))
    assert EventWriter(path).emit(EventKind.STEP, step=3, loss=0.5)["seq"] == 3
    assert [e["seq"] for e in read_event_file(path).events] == [1, 2, 3]
