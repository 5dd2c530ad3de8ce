"""Checking a dataset file end to end: read, convert, check each row, find duplicates, count tokens.

One streaming pass; memory grows only with the number of rows (two small integers per row for duplicates and
lengths), never with the file size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.core.data.findings import CODE_INFO, Code, Finding, Severity
from desktop.core.data.formats import FORMAT_NAMES, ConversionError, DataFormat, to_messages
from desktop.core.data.pairs import LengthBias, answer_only, check_pair, pair_messages, side_conversation
from desktop.core.data.report import DataReport, token_stats
from desktop.core.data.rules import check_messages, exact_key, near_key, private_text_findings
from desktop.services.data.reader import DatasetFileError, FileProblem, RawRow, choose_format, iter_rows
from desktop.services.data.tokens import Conversation, EstimatedTokenCounter, TokenCounter
from trainer_payload.protocol import pair_form

Progress = Callable[[int, int], None]
BATCH = 512


@dataclass
class CheckOutcome:
    """A report plus what ``prepare`` needs: which rows to keep and their lengths.

    Attributes:
        report: What was found.
        lengths: Row number → token length, for every row without errors.
        duplicates: Row numbers that repeat an earlier row (exactly or nearly).
        fmt: The detected format.
        mapping: The column mapping used for tabular input.
        secrets: Row numbers without errors that hold a suspected secret.
        fields: The fields of the first readable row (a table's columns).
        fatal_kind: Why the file is unusable as a whole, when ``report.fatal`` is set.
        pair_form: A preference file's form (``plain text`` or ``chat messages``, its first pair's).
        length_bias: A preference file's answer lengths, chosen against rejected.
        same_answers: Row numbers of pairs whose chosen answer is the rejected one (they teach nothing).
    """

    report: DataReport
    lengths: dict[int, int] = field(default_factory=dict)
    duplicates: set[int] = field(default_factory=set)
    fmt: DataFormat | None = None
    mapping: dict[str, str] | None = None
    secrets: set[int] = field(default_factory=set)
    fields: list[str] = field(default_factory=list)
    fatal_kind: FileProblem | None = None
    pair_form: str | None = None
    length_bias: LengthBias = field(default_factory=LengthBias)
    same_answers: set[int] = field(default_factory=set)

    def kept_lengths(self, leave_out_secrets: bool = False) -> dict[int, int]:
        """Lengths of the rows ``prepare`` keeps.

        That is: no errors, the first of their duplicates, no pair whose two answers are the same, and no suspected
        secret when asked.
        """
        dropped = self.duplicates | self.same_answers
        dropped |= self.secrets if leave_out_secrets else set()
        return {line: n for line, n in self.lengths.items() if line not in dropped}

    def problems(self, severity: Severity) -> int:
        """Findings of one severity (a row may have several)."""
        return sum(s.count for code, s in self.report.summaries.items() if CODE_INFO[code].severity is severity)


class _DuplicateFinder:
    """Remembers a 64-bit digest per distinct row; reports repeats with the line they repeat."""

    def __init__(self) -> None:
        self._exact: dict[int, int] = {}
        self._near: dict[int, int] = {}

    def check(self, messages: list[dict[str, Any]], line: int) -> Finding | None:
        exact = int.from_bytes(exact_key(messages)[:8], "big")
        first = self._exact.setdefault(exact, line)
        if first != line:
            return Finding(Code.DUPLICATE, line, f"same as line {first}")
        near = int.from_bytes(near_key(messages)[:8], "big")
        first = self._near.setdefault(near, line)
        return None if first == line else Finding(Code.NEAR_DUPLICATE, line, f"nearly the same as line {first}")


def _converted(raw: RawRow, fmt: DataFormat, mapping: Mapping[str, str] | None) -> tuple[Any, Finding | None]:
    assert raw.data is not None
    try:
        return to_messages(raw.data, fmt, mapping), None
    except ConversionError as exc:
        return None, Finding(Code.WRONG_TYPE, raw.line, str(exc))


def _chat_row(raw: RawRow, outcome: CheckOutcome) -> tuple[dict[str, Any] | None, list[Finding], Conversation]:
    assert outcome.fmt is not None
    messages, problem = _converted(raw, outcome.fmt, outcome.mapping)
    findings = [problem] if problem else check_messages(messages, raw.line)
    return {"messages": messages}, findings, messages


def _pair_row(raw: RawRow, outcome: CheckOutcome) -> tuple[dict[str, Any] | None, list[Finding], Conversation]:
    pair, findings = check_pair(raw.data, raw.line, outcome.pair_form)
    if pair is None:
        return None, findings, []
    outcome.pair_form = outcome.pair_form or pair_form(pair)
    return pair, findings, pair_messages(pair)


def _text_row(raw: RawRow, outcome: CheckOutcome) -> tuple[dict[str, Any] | None, list[Finding], Conversation]:
    """A raw text document (``{"text": ...}``): it must be text, not empty; secrets and addresses are said."""
    assert raw.data is not None
    text = raw.data.get("text")
    if not isinstance(text, str):
        return None, [Finding(Code.WRONG_TYPE, raw.line, f"'text' must be a string, got {type(text).__name__}")], []
    if not text.strip():
        return None, [Finding(Code.EMPTY_CONTENT, raw.line, "the document is empty")], []
    messages = [{"role": "text", "content": text}]
    return {"text": text}, list(private_text_findings(messages, raw.line)), messages


_READERS = {DataFormat.PAIRS: _pair_row, DataFormat.TEXT: _text_row}


def iter_training_rows(
    path: Path, outcome: CheckOutcome, columns: Mapping[str, str] | None, progress: Progress | None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (line, row) for every row without errors, as the trainer reads it; records every finding in ``outcome``.

    A chat row is ``{"messages": [...]}``, a preference pair TRL's ``prompt`` / ``chosen`` / ``rejected``, a raw text
    document ``{"text": ...}``.
    """
    rows = iter_rows(path)
    total = max(1, path.stat().st_size)
    duplicates = _DuplicateFinder()
    report = outcome.report
    for raw in rows:
        report.rows += 1
        if progress and report.rows % 4096 == 0:
            progress(raw.bytes_read, total)
        if raw.problem is not None:
            report.add(raw.problem)
            continue
        assert raw.data is not None
        if outcome.fmt is None:
            outcome.fields = [str(name) for name in raw.data]
            outcome.fmt, outcome.mapping = choose_format(raw.data, columns)
            report.format = FORMAT_NAMES[outcome.fmt]
        reader = _READERS.get(outcome.fmt, _chat_row)
        row, findings, messages = reader(raw, outcome)
        for finding in findings:
            report.add(finding)
        if row is None or any(f.severity is Severity.ERROR for f in findings):
            continue
        if any(f.code is Code.SECRET for f in findings):
            outcome.secrets.add(raw.line)
        if any(f.code is Code.SAME_ANSWERS for f in findings):
            outcome.same_answers.add(raw.line)
        repeat = duplicates.check(messages, raw.line)
        if repeat is not None:
            report.add(repeat)
            outcome.duplicates.add(raw.line)
        report.valid += 1
        yield raw.line, row
    if progress:
        progress(total, total)


def iter_conversations(
    path: Path, outcome: CheckOutcome, columns: Mapping[str, str] | None, progress: Progress | None
) -> Iterator[tuple[int, Conversation]]:
    """Yields (line, messages) for every chat row without errors (see :func:`iter_training_rows`)."""
    for line, row in iter_training_rows(path, outcome, columns, progress):
        if "messages" in row:
            yield line, row["messages"]


def _count_batch(
    batch: list[tuple[int, dict[str, Any]]], counter: TokenCounter, outcome: CheckOutcome, seq_len: int
) -> None:
    if outcome.fmt is DataFormat.PAIRS:
        _count_pairs(batch, counter, outcome, seq_len)
        return
    if outcome.fmt is DataFormat.TEXT:  # packed into full sequences: a long document is never cut
        for (line, _), length in zip(batch, counter.count_text([row["text"] for _, row in batch]), strict=True):
            outcome.lengths[line] = length
        return
    for (line, _), length in zip(batch, counter.count([row["messages"] for _, row in batch]), strict=True):
        outcome.lengths[line] = length
        if length > seq_len:
            outcome.report.add(Finding(Code.TOO_LONG, line, f"{length} tokens, {length - seq_len} cut"))


def _count_pairs(
    batch: list[tuple[int, dict[str, Any]]], counter: TokenCounter, outcome: CheckOutcome, seq_len: int
) -> None:
    """Each pair's two sides (prompt and answer) against ``seq_len``, and its answers alone for the length bias."""
    conversations = []
    for _, pair in batch:
        conversations += [side_conversation(pair, "chosen"), side_conversation(pair, "rejected")]
        conversations += [answer_only(pair, "chosen"), answer_only(pair, "rejected")]
    counts = counter.count(conversations)
    for index, (line, _) in enumerate(batch):
        chosen, rejected, chosen_answer, rejected_answer = counts[4 * index : 4 * index + 4]
        outcome.lengths[line] = max(chosen, rejected)
        outcome.length_bias.add(chosen_answer, rejected_answer)
        cut = [f"{side} {n} tokens, {n - seq_len} cut" for side, n in (("chosen", chosen), ("rejected", rejected))]
        sides = [words for words, n in zip(cut, (chosen, rejected), strict=True) if n > seq_len]
        if sides:
            outcome.report.add(Finding(Code.TOO_LONG, line, "; ".join(sides)))


def check_dataset(
    path: Path,
    *,
    seq_len: int = 2048,
    counter: TokenCounter | None = None,
    columns: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> CheckOutcome:
    """Checks a dataset file and counts its tokens.

    Args:
        path: A JSONL, CSV or Parquet file.
        seq_len: Training sequence length (longer examples are reported and would be truncated).
        counter: Token counter; the labelled estimate by default.
        columns: Role → column mapping for tabular files (guessed when omitted).
        progress: Called with (bytes done, total bytes) now and then.

    Returns:
        The outcome; ``outcome.report.fatal`` is set when the file is unusable as a whole.
    """
    counter = counter or EstimatedTokenCounter()
    outcome = CheckOutcome(DataReport(str(path)))
    batch: list[tuple[int, dict[str, Any]]] = []
    try:
        for item in iter_training_rows(path, outcome, columns, progress):
            batch.append(item)
            if len(batch) == BATCH:
                _count_batch(batch, counter, outcome, seq_len)
                batch.clear()
    except DatasetFileError as exc:
        outcome.report.fatal, outcome.fatal_kind = str(exc), exc.kind
        outcome.fields = exc.fields or outcome.fields
        return outcome
    except OSError as exc:
        outcome.report.fatal = f"{path} cannot be read ({exc.strerror or exc}); check the file and its permissions"
        outcome.fatal_kind = FileProblem.UNREADABLE
        return outcome
    if batch:
        _count_batch(batch, counter, outcome, seq_len)
    if outcome.report.rows == 0:
        outcome.report.fatal, outcome.fatal_kind = f"{path.name} holds no rows", FileProblem.EMPTY
    elif outcome.report.valid == 0:
        outcome.report.fatal = "no row is usable; fix the errors listed"
        outcome.fatal_kind = FileProblem.NO_USABLE_ROW
    packed = outcome.fmt is DataFormat.TEXT
    outcome.report.tokens = token_stats(list(outcome.lengths.values()), seq_len, counter.description, packed=packed)
    note = outcome.length_bias.note()
    outcome.report.notes += [note] if note else []
    return outcome
