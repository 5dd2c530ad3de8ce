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
TS = 1_760_000_000.0  # seconds since 1970, in 2025


def checkpoint(**changes: Any) -> dict[str, Any]:
    event = {
        "ts": TS,
        "seq": 3,
        "event": "checkpoint",
        "step": 10,
        "path": "checkpoint-10",
        "bytes": 123,
        "sha256": {"adapter_model.safetensors": DIGEST, "sub/x.json": DIGEST},
    }
    return {**event, **changes}


GOOD = [
    {"ts": TS, "seq": 1, "event": "state", "state": "training", "resume_from": None, "extra": [1]},
    {"ts": TS, "seq": 2, "event": "step", "step": 1, "loss": 2.5, "lr": None, "tokens_per_s": 10, "gpu": {}},
    checkpoint(),
    {"ts": TS, "seq": 4, "event": "eval", "step": 10, "eval_loss": 1.25},
    {"ts": TS, "seq": 5, "event": "error", "kind": "oom", "message": "out of memory", "hint": "lower micro_batch"},
    {"ts": TS, "seq": 6, "event": "done", "adapter_path": "adapter", "files": {"a.bin": DIGEST}, "metrics": {}},
]


@pytest.mark.parametrize("event", GOOD, ids=lambda e: e["event"])
def test_events_the_payload_writes_pass(event: dict[str, Any]) -> None:
    assert validate_event(event) is event


@pytest.mark.parametrize(
    ("event", "named"),
    [
        ([1, 2], "JSON object"),
        ({"seq": 1, "event": "state", "state": "x"}, "'ts'"),
        ({"ts": TS, "seq": "1", "event": "state", "state": "x"}, "'seq'"),
        ({"ts": TS, "seq": True, "event": "state", "state": "x"}, "'seq'"),
        ({"ts": TS, "seq": 0, "event": "state", "state": "x"}, "seq 0"),
        ({"ts": TS, "seq": 1, "event": "teleport"}, "unknown event kind"),
        ({"ts": TS, "seq": 1, "event": "step", "step": 1}, "'loss'"),
        ({"ts": TS, "seq": 1, "event": "step", "step": 1, "loss": "low"}, "'loss'"),
        ({"ts": TS, "seq": 1, "event": "step", "step": 1, "loss": 1.0, "total_steps": "9"}, "'total_steps'"),
        ({"ts": TS, "seq": 1, "event": "state"}, "'state'"),
        ({"ts": TS, "seq": 1, "event": "error", "kind": "oom"}, "'message'"),
        (checkpoint(bytes=None), "'bytes'"),
        (checkpoint(sha256=[DIGEST]), "'sha256'"),
        (checkpoint(sha256={"a": "not-hex"}), "SHA-256"),
        ({"ts": TS, "seq": 1, "event": "done", "adapter_path": "adapter"}, "'files'"),
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
        {"ts": TS, "seq": 1, "event": "done", "adapter_path": name, "files": {}},
        {"ts": TS, "seq": 1, "event": "done", "adapter_path": "adapter", "files": {name: DIGEST}},
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
        '{"ts": 1760000000, "seq": 2, "event": "step", "step": 1}',  # a required field missing
        "[" * 100_000,  # nested past the JSON decoder's recursion limit
        json.dumps(GOOD[1]),
        '{"ts": 1760000000, "seq": 7, "ev',  # torn: no newline yet, left for the next read
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


def state_line(ts: str = str(TS), seq: str = "1") -> str:
    return f'{{"ts": {ts}, "seq": {seq}, "event": "state", "state": "training"}}'


def step_line(**fields: str) -> str:
    given = {"ts": str(TS), "seq": "1", "event": '"step"', "step": "1", "loss": "2.5", **fields}
    return "{" + ", ".join(f'"{name}": {value}' for name, value in given.items()) + "}"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (state_line(ts="NaN"), "ts NaN must be seconds since 1970"),
        (state_line(ts="Infinity"), "ts Infinity must be seconds since 1970"),
        (state_line(ts="-Infinity"), "ts -Infinity must be seconds since 1970"),
        (state_line(ts="1e300"), "ts 1e+300 must be seconds since 1970"),
        (state_line(ts="1e999"), "ts Infinity"),  # too large for a double: Python reads it as infinity
        (state_line(ts="12"), "ts 12 must be seconds since 1970"),  # 1970
        (state_line(ts="4200000000"), "ts 4200000000 must be seconds since 1970"),  # 2103
        (state_line(ts="1" + "0" * 400), "must be seconds since 1970"),  # a whole number no double holds
        (state_line(seq=str(2**53 + 1)), f"seq {2**53 + 1} must be from 1 to 2**53"),
        (step_line(loss="NaN"), "step field 'loss' must be a finite number"),
        (step_line(loss="-Infinity"), "step field 'loss' must be a finite number"),
        (step_line(step="10000000000000001"), "step field 'step' must be a finite number of at most 1e15"),
        (step_line(lr="NaN"), "step field 'lr'"),
        (step_line(gpu='{"memory": [1.5, Infinity]}'), "step field 'gpu.memory[1]'"),
        (step_line(tokens="-2e15"), "step field 'tokens'"),
        (step_line(detail='[[[{"x": NaN}]]]'), "step field 'detail[0][0][0].x'"),
    ],
)
def test_numbers_that_are_not_finite_or_absurd_are_refused_like_any_malformed_line(line: str, named: str) -> None:
    chunk = parse_event_chunk(f"{state_line(seq='7')}\n{line}\n".encode())
    assert [e["seq"] for e in chunk.events] == [7], "the good line is read, the bad one skipped"
    assert len(chunk.skipped) == 1 and named in chunk.skipped[0], chunk.skipped
    with pytest.raises(EventError, match="must be"):
        validate_event(json.loads(line))


def test_the_edges_of_every_range_are_accepted() -> None:
    for event in (
        {"ts": 1e9, "seq": 2**53, "event": "state", "state": "training"},
        {"ts": 4.1e9, "seq": 1, "event": "step", "step": 10**15, "loss": -1e15, "gpu": {"temps": [0.0, 1e-300]}},
    ):
        assert validate_event(event) is event
