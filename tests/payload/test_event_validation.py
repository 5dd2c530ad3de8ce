"""Events from the machine are untrusted: each is checked against the protocol before the app acts on it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainer_payload.protocol import (
    EventError,
    UnsafePathError,
    check_relative_path,
    parse_event_chunk,
    validate_event,
)

DIGEST = "ab" * 32


def checkpoint(**changes: Any) -> dict[str, Any]:
    event = {
        "ts": 1.0,
        "seq": 3,
        "event": "checkpoint",
        "step": 10,
        "path": "checkpoint-10",
        "bytes": 123,
        "sha256": {"adapter_model.safetensors": DIGEST, "sub/x.json": DIGEST},
    }
    return {**event, **changes}


GOOD = [
    {"ts": 1.0, "seq": 1, "event": "state", "state": "training", "resume_from": None, "extra": [1]},
    {"ts": 1, "seq": 2, "event": "step", "step": 1, "loss": 2.5, "lr": None, "tokens_per_s": 10, "gpu": {}},
    checkpoint(),
    {"ts": 1.0, "seq": 4, "event": "eval", "step": 10, "eval_loss": 1.25},
    {"ts": 1.0, "seq": 5, "event": "error", "kind": "oom", "message": "out of memory", "hint": "lower micro_batch"},
    {"ts": 1.0, "seq": 6, "event": "done", "adapter_path": "adapter", "files": {"a.bin": DIGEST}, "metrics": {}},
]


@pytest.mark.parametrize("event", GOOD, ids=lambda e: e["event"])
def test_events_the_payload_writes_pass(event: dict[str, Any]) -> None:
    assert validate_event(event) is event


@pytest.mark.parametrize(
    ("event", "named"),
    [
        ([1, 2], "JSON object"),
        ({"seq": 1, "event": "state", "state": "x"}, "'ts'"),
        ({"ts": 1, "seq": "1", "event": "state", "state": "x"}, "'seq'"),
        ({"ts": 1, "seq": True, "event": "state", "state": "x"}, "'seq'"),
        ({"ts": 1, "seq": 0, "event": "state", "state": "x"}, "seq 0"),
        ({"ts": 1, "seq": 1, "event": "teleport"}, "unknown event kind"),
        ({"ts": 1, "seq": 1, "event": "step", "step": 1}, "'loss'"),
        ({"ts": 1, "seq": 1, "event": "step", "step": 1, "loss": "low"}, "'loss'"),
        ({"ts": 1, "seq": 1, "event": "step", "step": 1, "loss": 1.0, "total_steps": "9"}, "'total_steps'"),
        ({"ts": 1, "seq": 1, "event": "state"}, "'state'"),
        ({"ts": 1, "seq": 1, "event": "error", "kind": "oom"}, "'message'"),
        (checkpoint(bytes=None), "'bytes'"),
        (checkpoint(sha256=[DIGEST]), "'sha256'"),
        (checkpoint(sha256={"a": "not-hex"}), "SHA-256"),
        ({"ts": 1, "seq": 1, "event": "done", "adapter_path": "adapter"}, "'files'"),
    ],
)
def test_malformed_events_are_refused_naming_the_field(event: object, named: str) -> None:
    with pytest.raises(EventError, match=named) as raised:
        validate_event(event)
    assert not isinstance(raised.value, UnsafePathError)


UNSAFE = ["../../x", "/etc/passwd", "a/../../b", "..", "a\\b", "C:evil", "c:/x", "", "a//b", "./a", "a/", "a\nb"]


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_file_names_are_refused(name: str) -> None:
    with pytest.raises(UnsafePathError):
        check_relative_path(name)
    for event in (
        checkpoint(path=name),
        checkpoint(sha256={name: DIGEST}),
        {"ts": 1, "seq": 1, "event": "done", "adapter_path": name, "files": {}},
        {"ts": 1, "seq": 1, "event": "done", "adapter_path": "adapter", "files": {name: DIGEST}},
    ):
        with pytest.raises(UnsafePathError):
            validate_event(event)


def test_plain_relative_names_are_accepted() -> None:
    for name in ("checkpoint-10", "sub/dir/file.json", "a..b", ".hidden", "v1:final"):
        assert check_relative_path(name) == name


def test_a_torn_or_garbage_line_is_skipped_and_said_why_while_the_rest_is_read() -> None:
    lines = [
        json.dumps(GOOD[0]),
        "garbage that is not JSON",
        '{"ts": 1, "seq": 2, "event": "step", "step": 1}',  # a required field missing
        "[" * 100_000,  # nested past the JSON decoder's recursion limit
        json.dumps(GOOD[1]),
        '{"ts": 1, "seq": 7, "ev',  # torn: no newline yet, left for the next read
    ]
    data = "\n".join(lines).encode()
    chunk = parse_event_chunk(data)
    assert [e["seq"] for e in chunk.events] == [1, 2]
    assert chunk.used == data.rfind(b"\n") + 1
    assert len(chunk.skipped) == 3 and "garbage" in chunk.skipped[0] and "'loss'" in chunk.skipped[1]
    assert parse_event_chunk(b"\xff\xfe not utf-8\n").skipped, "bytes that are not UTF-8 are skipped too"


def test_an_unsafe_event_in_a_chunk_is_not_skipped_but_raised() -> None:
    data = (json.dumps(GOOD[0]) + "\n" + json.dumps(checkpoint(path="../../x")) + "\n").encode()
    with pytest.raises(UnsafePathError, match=r"\.\./\.\./x"):
        parse_event_chunk(data)
