"""Each kind of event has one typed shape, and the validation checks exactly its fields (they cannot drift)."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import pytest

from trainer_payload.protocol import EVENT_TYPES, EventError, EventKind, validate_event

STAMP = {"ts", "seq", "event"}


def _base(declared: Any) -> type:
    """The JSON type of a field's annotation, null aside (``float | None`` is ``float``)."""
    arms = typing.get_args(declared) if isinstance(declared, types.UnionType) else (declared,)
    base = next(typing.get_origin(arm) or arm for arm in arms if arm is not type(None))
    assert isinstance(base, type)
    return base


SAMPLES: dict[type, object] = {int: 7, float: 1.5, str: "adapter", dict: {}, bool: True, list: []}
WRONG: dict[type, object] = {int: "7", float: "fast", str: 5, dict: [], bool: 1, list: {}}


def _minimal(kind: EventKind) -> tuple[dict[str, Any], dict[str, Any]]:
    """An event of ``kind`` holding only its required fields, each a value of its declared type, and the hints."""
    shape = EVENT_TYPES[kind]
    hints = typing.get_type_hints(shape)
    fields = {name: SAMPLES[_base(hints[name])] for name in shape.__required_keys__ - STAMP}
    return {"ts": 1_760_000_000.0, "seq": 1, "event": kind.value, **fields}, hints


def test_every_kind_has_a_shape_whose_tag_is_its_kind() -> None:
    assert set(EVENT_TYPES) == set(EventKind)
    for kind, shape in EVENT_TYPES.items():
        assert typing.get_type_hints(shape)["event"] == Literal[kind]
        assert shape.__required_keys__ >= STAMP


@pytest.mark.parametrize("kind", list(EventKind))
def test_an_event_with_its_required_fields_of_their_types_is_valid_and_tagged(kind: EventKind) -> None:
    event, _ = _minimal(kind)
    assert validate_event(event)["event"] is kind


@pytest.mark.parametrize("kind", list(EventKind))
def test_each_required_field_is_checked_for_presence_and_type(kind: EventKind) -> None:
    event, hints = _minimal(kind)
    for name in sorted(EVENT_TYPES[kind].__required_keys__ - STAMP):
        with pytest.raises(EventError, match=repr(name)):
            validate_event({key: value for key, value in event.items() if key != name})
        with pytest.raises(EventError, match=repr(name)):
            validate_event(event | {name: WRONG[_base(hints[name])]})
        with pytest.raises(EventError, match=repr(name)):
            validate_event(event | {name: None})


@pytest.mark.parametrize("kind", list(EventKind))
def test_each_optional_field_may_be_missing_or_null_and_is_checked_for_type(kind: EventKind) -> None:
    event, hints = _minimal(kind)
    for name in sorted(EVENT_TYPES[kind].__optional_keys__):
        assert type(None) in typing.get_args(hints[name]), f"{kind}.{name} is optional, so it may be null"
        validate_event(event | {name: None})
        validate_event(event | {name: SAMPLES[_base(hints[name])]})
        with pytest.raises(EventError, match=repr(name)):
            validate_event(event | {name: WRONG[_base(hints[name])]})


def test_fields_no_shape_declares_are_free() -> None:
    event, _ = _minimal(EventKind.STATE)
    assert validate_event(event | {"detail": ["anything"], "ready_seconds": "soon"})["event"] is EventKind.STATE
