"""Removing secrets from text before it is logged, shown or written anywhere.

Two layers: the exact values of secrets the app knows (API keys loaded from the keyring or the environment), and
patterns of well-known token formats, so a token pasted into a dataset path or an error message is caught too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MASK = "***"

# Well-known secret formats: Hugging Face, RunPod, OpenAI-style, GitHub, AWS access keys, PEM private keys, and
# `key=value` / `Authorization: Bearer` assignments whose name says they are secret.
_TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),
    re.compile(r"\brpa_[A-Za-z0-9]{20,}\b"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}\b"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL),
]
_ASSIGNMENT = re.compile(
    r"(?i)\b((?:api[_-]?key|token|secret|password|bearer)\b[\"']?\s*[:=]?\s*[\"']?)([A-Za-z0-9_\-\.]{12,})"
)
_MIN_SECRET_LENGTH = 6
# Environment variables whose values are secret by their name: Rentune's own (RUNPOD_API_KEY, VAST_API_KEY,
# LAMBDA_API_KEY, HF_TOKEN) and any other *_API_KEY, *_TOKEN or *SECRET* a user or a CI set.
_SECRET_VARIABLE_SUFFIXES = ("_API_KEY", "_TOKEN", "_KEY_ID")


def is_secret_variable(name: str) -> bool:
    """Whether a variable's name says its value is a secret (``*_API_KEY``, ``*_TOKEN``, ``*_KEY_ID``, ``*SECRET*``)."""
    upper = name.upper()
    return upper.endswith(_SECRET_VARIABLE_SUFFIXES) or "SECRET" in upper


def secret_variable_values(environ: Mapping[str, str]) -> set[str]:
    """The values (stripped, non-empty) of the environment variables that :func:`is_secret_variable` names."""
    return {value.strip() for name, value in environ.items() if is_secret_variable(name) and value.strip()}


def redact(text: str, known_secrets: Iterable[str] = ()) -> str:
    """Returns ``text`` with every secret replaced by ``***``.

    Args:
        text: Any text about to be logged, shown or stored.
        known_secrets: Exact secret values to remove; values shorter than six characters are ignored, since
            masking them would mangle ordinary words.

    Returns:
        The text with the secrets masked.
    """
    for secret in sorted({s for s in known_secrets if len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(MASK, text)
    return _ASSIGNMENT.sub(lambda m: m.group(1) + MASK, text)
