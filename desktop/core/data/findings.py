"""What a dataset check can find, how bad it is, and the one-line fix for each."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Severity(StrEnum):
    """Errors make a row unusable for training; warnings are worth a look (and ``prepare`` may act on them)."""

    ERROR = "error"
    WARNING = "warning"


class Code(StrEnum):
    """Kinds of findings."""

    INVALID_JSON = "invalid-json"
    NOT_UTF8 = "not-utf8"
    WRONG_TYPE = "wrong-type"
    UNKNOWN_ROLE = "unknown-role"
    EMPTY_CONTENT = "empty-content"
    NO_ASSISTANT = "no-assistant"
    LAST_NOT_ASSISTANT = "last-not-assistant"
    SYSTEM_NOT_FIRST = "system-not-first"
    DUPLICATE = "duplicate"
    NEAR_DUPLICATE = "near-duplicate"
    TOO_LONG = "too-long"
    SECRET = "secret"  # noqa: S105 - the name of a finding, not a password
    EMAIL = "email"
    # preference pairs (DPO, ORPO)
    PAIR_SHAPE = "pair-shape"
    MISSING_SIDE = "missing-side"
    PROMPT_DIFFERS = "prompt-differs"
    SAME_ANSWERS = "same-answers"


@dataclass(frozen=True)
class CodeInfo:
    """How a kind of finding is shown."""

    severity: Severity
    title: str
    fix: str


CODE_INFO: dict[Code, CodeInfo] = {
    Code.INVALID_JSON: CodeInfo(Severity.ERROR, "invalid JSON", "fix the line's JSON or delete the line"),
    Code.NOT_UTF8: CodeInfo(
        Severity.ERROR, "bytes that are not UTF-8", "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    ),
    Code.WRONG_TYPE: CodeInfo(
        Severity.ERROR, "wrong field types", "each row needs 'messages': a list of {role: str, content: str}"
    ),
    Code.UNKNOWN_ROLE: CodeInfo(Severity.ERROR, "unknown roles", "use the roles system, user, assistant or tool"),
    Code.EMPTY_CONTENT: CodeInfo(Severity.ERROR, "empty messages", "fill in or remove the empty messages"),
    Code.NO_ASSISTANT: CodeInfo(
        Severity.ERROR, "no assistant turn", "add the answer the model should learn as an assistant message"
    ),
    Code.LAST_NOT_ASSISTANT: CodeInfo(
        Severity.ERROR,
        "conversation does not end with the assistant",
        "end each conversation with the assistant's answer (drop trailing turns)",
    ),
    Code.SYSTEM_NOT_FIRST: CodeInfo(
        Severity.ERROR, "system message not first", "move the system message to the start of the conversation"
    ),
    Code.DUPLICATE: CodeInfo(
        Severity.WARNING, "exact duplicates", "remove them (preparing the data does) so they are not over-weighted"
    ),
    Code.NEAR_DUPLICATE: CodeInfo(
        Severity.WARNING,
        "near-exact duplicates (same text up to case, spacing, punctuation)",
        "remove them (preparing the data does)",
    ),
    Code.TOO_LONG: CodeInfo(
        Severity.WARNING,
        "longer than the sequence length",
        "raise the sequence length (more memory) or shorten or split these examples; the excess is cut",
    ),
    Code.SECRET: CodeInfo(
        Severity.WARNING,
        "suspected secrets (API keys, tokens, private keys)",
        "remove secrets before training: a model can learn and repeat them",
    ),
    Code.EMAIL: CodeInfo(Severity.WARNING, "e-mail addresses", "check the data may be used; anonymise if needed"),
    Code.PAIR_SHAPE: CodeInfo(
        Severity.ERROR,
        "not a usable pair",
        "give 'chosen' and 'rejected' as text, or as message lists ending with the assistant's answer, and every "
        "pair of a file in one form",
    ),
    Code.MISSING_SIDE: CodeInfo(
        Severity.ERROR, "a side of the pair missing", "give both a 'chosen' and a 'rejected' answer, or drop the row"
    ),
    Code.PROMPT_DIFFERS: CodeInfo(
        Severity.ERROR,
        "chosen and rejected differ before their answers",
        "give both conversations the same turns before the answer, or give the prompt once as 'prompt'",
    ),
    Code.SAME_ANSWERS: CodeInfo(
        Severity.WARNING,
        "chosen the same as rejected",
        "give a worse rejected answer, or drop the pair (preparing the data does): it teaches nothing",
    ),
}


@dataclass(frozen=True)
class Finding:
    """One problem at one line (or row) of the input.

    Attributes:
        code: What was found.
        line: 1-based line of a JSONL file, or row number of a CSV/Parquet file.
        detail: Specifics (which message, which field, which earlier line).
    """

    code: Code
    line: int
    detail: str = ""

    @property
    def severity(self) -> Severity:
        """Error or warning."""
        return CODE_INFO[self.code].severity
