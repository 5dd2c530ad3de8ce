"""Per-row checks of a ``messages`` conversation, duplicate keys, and the secret/PII scan."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from desktop.core.data.findings import Code, Finding

ROLES = frozenset({"system", "user", "assistant", "tool"})
_ENCODER = msgspec.json.Encoder()

_SECRET = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}|\brpa_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_\-]{20,}|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bAKIA[0-9A-Z]{16}\b|-----BEGIN [A-Z ]*PRIVATE KEY-----|\bxox[baprs]-[A-Za-z0-9-]{10,}"
)
# Substrings every secret pattern contains, grouped by a character that is rare in prose: a cheap test before
# the regex (most rows contain none of them).
_UNDERSCORE_MARKERS = ("hf_", "rpa_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_")
_DASH_MARKERS = ("sk-", "xox", "-----BEGIN")
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")
# ASCII punctuation, spacing and control characters are dropped for the near-duplicate key.
_NOT_ALNUM_ASCII = bytes(c for c in range(128) if not chr(c).isalnum())


def _shape_findings(messages: Any, line: int) -> list[Finding]:
    if not isinstance(messages, list) or not messages:
        return [Finding(Code.WRONG_TYPE, line, "'messages' must be a non-empty list")]
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return [Finding(Code.WRONG_TYPE, line, f"message {index + 1} is not an object")]
        if not isinstance(message.get("role"), str):
            return [Finding(Code.WRONG_TYPE, line, f"message {index + 1}: 'role' must be a string")]
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            return [
                Finding(
                    Code.WRONG_TYPE,
                    line,
                    f"message {index + 1}: 'content' must be a string, got {type(content).__name__}",
                )
            ]
    return []


def _role_findings(messages: list[dict[str, Any]], line: int) -> Iterator[Finding]:
    roles = [m["role"] for m in messages]
    for index, role in enumerate(roles):
        if role not in ROLES:
            yield Finding(Code.UNKNOWN_ROLE, line, f"message {index + 1} has role {role!r}")
        elif role == "system" and index > 0:
            yield Finding(Code.SYSTEM_NOT_FIRST, line, f"system message at position {index + 1}")
    if "assistant" not in roles:
        yield Finding(Code.NO_ASSISTANT, line)
    elif roles[-1] != "assistant":
        yield Finding(Code.LAST_NOT_ASSISTANT, line, f"last message is {roles[-1]!r}")


def _may_hold_secret(text: str) -> bool:
    return (
        ("_" in text and any(marker in text for marker in _UNDERSCORE_MARKERS))
        or ("-" in text and any(marker in text for marker in _DASH_MARKERS))
        or "AKIA" in text
    )


def _content_findings(messages: list[dict[str, Any]], line: int) -> Iterator[Finding]:
    for index, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str) and not content.strip() and not message.get("tool_calls"):
            yield Finding(Code.EMPTY_CONTENT, line, f"message {index + 1} ({message['role']}) is empty")
    yield from private_text_findings(messages, line)


def private_text_findings(messages: list[dict[str, Any]], line: int) -> Iterator[Finding]:
    """Suspected secrets and e-mail addresses anywhere in the messages' texts."""
    text = "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
    if _may_hold_secret(text) and _SECRET.search(text):
        yield Finding(Code.SECRET, line)
    if "@" in text and _EMAIL.search(text):
        yield Finding(Code.EMAIL, line)


def check_messages(messages: Any, line: int) -> list[Finding]:
    """Checks one conversation; returns every finding (empty when the row is clean)."""
    shape = _shape_findings(messages, line)
    if shape:
        return shape
    return [*_role_findings(messages, line), *_content_findings(messages, line)]


def exact_key(messages: list[dict[str, Any]]) -> bytes:
    """A 16-byte digest of the conversation's roles and texts."""
    pairs = [(m["role"], m.get("content") or "") for m in messages]
    return hashlib.blake2b(_ENCODER.encode(pairs), digest_size=16).digest()


def near_key(messages: list[dict[str, Any]]) -> bytes:
    """A digest of the texts lower-cased with punctuation and spacing removed (catches near-exact copies)."""
    text = "".join([m.get("content") or "" for m in messages]).lower().encode()
    return hashlib.blake2b(text.translate(None, _NOT_ALNUM_ASCII), digest_size=16).digest()
