"""Task checks: whether a model's answer to a held-out row is right, chosen from what the reference answers look like.

Answers that are JSON are right when they are valid JSON with the reference's keys (and, when the user gives one,
valid against a JSON Schema: that check is done by the service, which holds the schema library). Answers from a small
set of labels are right when the label matches; any other answer when it matches the reference after normalising
(case, spaces, closing punctuation, quotes and code fences). A regular expression the user gives is one more check.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from enum import StrEnum
from typing import Any


class CheckKind(StrEnum):
    """A way to say whether an answer is right."""

    EXACT = "exact"
    NORMALISED = "normalised"
    LABEL = "label"
    JSON_KEYS = "json_keys"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"


#: What each check means, in words for the report.
CHECK_WORDS = {
    CheckKind.EXACT: "exact match with the reference",
    CheckKind.NORMALISED: "match with the reference after normalising case, spaces, quotes and closing punctuation",
    CheckKind.LABEL: "the right label",
    CheckKind.JSON_KEYS: "valid JSON with the reference's keys",
    CheckKind.JSON_SCHEMA: "valid JSON that the given JSON Schema accepts",
    CheckKind.REGEX: "the answer matches the given regular expression",
}

#: A label is short: at most this many words.
LABEL_MAX_WORDS = 3
#: At most this many distinct labels make a label set.
LABEL_MAX_COUNT = 20

_FENCE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_CLOSING = ".!?;:,"
_QUOTES = "\"'`\u201c\u201d\u2018\u2019"  # straight, back and curly quotes


def normalise(text: str) -> str:
    """``text`` without what does not change its meaning: code fences, case, runs of spaces, quotes, closing marks."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    text = " ".join(text.casefold().split())
    return text.strip(_QUOTES + " ").rstrip(_CLOSING).strip(_QUOTES + " ")


def parse_json(text: str) -> Any:
    """The JSON value of an answer (a fenced block is read inside its fence), or None when it is not JSON."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, (dict, list)) else None


def _keys(value: Any) -> frozenset[str] | None:
    if isinstance(value, dict):
        return frozenset(value)
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return frozenset().union(*(frozenset(item) for item in value))
    return None


def is_label_set(references: Sequence[str]) -> bool:
    """Whether the references are labels: short, few distinct ones, and most of them repeated."""
    labels = Counter(normalise(reference) for reference in references)
    if len(references) < 4 or not 2 <= len(labels) <= LABEL_MAX_COUNT:
        return False
    if any(len(label.split()) > LABEL_MAX_WORDS or not label for label in labels):
        return False
    return len(labels) <= len(references) / 2


def choose_checks(references: Sequence[str], *, regex: str | None = None, schema: bool = False) -> list[CheckKind]:
    """The checks for these references, the one that decides right or wrong first.

    JSON references get the JSON check (and the schema's, when given); labels the label check; anything else the
    normalised match and the exact match. A regular expression adds its check (it decides when it is the only one
    the user cares about: put it first with ``regex`` and no other reference shape).
    """
    if references and all(parse_json(reference) is not None for reference in references):
        checks = [CheckKind.JSON_SCHEMA, CheckKind.JSON_KEYS] if schema else [CheckKind.JSON_KEYS]
    elif is_label_set(references):
        checks = [CheckKind.LABEL]
    else:
        checks = [CheckKind.NORMALISED, CheckKind.EXACT]
    return checks + ([CheckKind.REGEX] if regex else [])


def passes(kind: CheckKind, reference: str, answer: str, *, regex: str | None = None) -> bool:
    """Whether ``answer`` passes ``kind`` against ``reference`` (the schema check is the service's)."""
    if kind is CheckKind.EXACT:
        return answer.strip() == reference.strip()
    if kind in (CheckKind.NORMALISED, CheckKind.LABEL):
        return normalise(answer) == normalise(reference)
    if kind is CheckKind.JSON_KEYS:
        value, expected = parse_json(answer), parse_json(reference)
        return value is not None and _keys(value) == _keys(expected) and type(value) is type(expected)
    if kind is CheckKind.REGEX:
        return regex is not None and re.search(regex, answer) is not None
    raise ValueError(f"{kind} is checked by the evaluation service")


def regex_problem(regex: str) -> str:
    """Why ``regex`` is not a usable regular expression ("" when it is)."""
    try:
        re.compile(regex)
    except re.error as exc:
        return f"the regular expression {regex!r} does not compile ({exc}): fix it, or leave it out"
    return ""
