"""Streaming rows out of JSONL, CSV and Parquet files, with the line (or row) number of each.

Nothing is read whole into memory: JSONL line by line, CSV row by row, Parquet batch by batch.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

from desktop.core.data.findings import Code, Finding
from desktop.core.data.formats import DataFormat, detect_format, guess_column_mapping
from desktop.services.platform.files import file_encoding

_DECODER = msgspec.json.Decoder()


class FileProblem(StrEnum):
    """Why a file as a whole cannot be used: front ends word each kind their own way."""

    MISSING = "missing"
    FOLDER = "folder"
    UNKNOWN_TYPE = "unknown-type"
    NOT_TEXT = "not-text"
    NOT_JSON = "not-json"
    PRETTY_JSON = "pretty-json"
    NOT_CSV = "not-csv"
    NEEDS_PYARROW = "needs-pyarrow"
    NOT_PARQUET = "not-parquet"
    UNKNOWN_LAYOUT = "unknown-layout"
    UNREADABLE = "unreadable"
    EMPTY = "empty"
    NO_USABLE_ROW = "no-usable-row"


class DatasetFileError(ValueError):
    """The file as a whole cannot be read; the message says why and what to do.

    Attributes:
        kind: Which problem it is.
        fields: The fields the first row has (for :attr:`FileProblem.UNKNOWN_LAYOUT`).
    """

    def __init__(self, message: str, kind: FileProblem = FileProblem.UNREADABLE, fields: list[str] | None = None):
        super().__init__(message)
        self.kind = kind
        self.fields = fields or []


@dataclass(frozen=True, slots=True)
class RawRow:
    """One row as read: its number, the decoded object or the reason it could not be decoded.

    Attributes:
        line: 1-based line (JSONL) or data row (CSV, Parquet).
        data: The decoded row, or ``None`` when ``problem`` is set.
        problem: Why the row could not be read.
        bytes_read: Bytes of the file consumed so far (for progress).
    """

    line: int
    data: Mapping[str, Any] | None
    problem: Finding | None
    bytes_read: int


def _jsonl_row(number: int, raw: bytes, done: int) -> RawRow:
    try:
        data = _DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            return RawRow(number, None, Finding(Code.NOT_UTF8, number, f"byte {bad.start + 1} of the line"), done)
        return RawRow(number, None, Finding(Code.INVALID_JSON, number, str(exc)), done)
    if not isinstance(data, dict):
        return RawRow(number, None, Finding(Code.WRONG_TYPE, number, "the line must hold a JSON object"), done)
    return RawRow(number, data, None, done)


def iter_json_array(path: Path, encoding: str = "utf-8") -> Iterator[RawRow]:
    """Yields the elements of a file holding one JSON array (decoded at once: such files are rarely large)."""
    raw = path.read_bytes()
    try:
        items = _DECODER.decode(raw if encoding == "utf-8" else raw.decode(encoding).encode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DatasetFileError(_not_text(path, encoding, exc), FileProblem.NOT_TEXT) from exc
    except msgspec.DecodeError as exc:
        raise DatasetFileError(
            f"{path} is not valid JSON ({exc}); fix it or export it as JSON Lines", FileProblem.NOT_JSON
        ) from exc
    done = path.stat().st_size
    for number, item in enumerate(items, start=1):
        if isinstance(item, dict):
            yield RawRow(number, item, None, done)
        else:
            yield RawRow(number, None, Finding(Code.WRONG_TYPE, number, "the element must be a JSON object"), done)


def _not_text(path: Path, encoding: str, exc: UnicodeDecodeError) -> str:
    name = "UTF-16" if encoding == "utf-16" else "UTF-8"
    return f"{path} starts like {name} text but is not valid {name} ({exc.reason}); save it again as UTF-8"


def _utf8_lines(path: Path, encoding: str) -> Iterator[tuple[bytes, int]]:
    """Yields each line of a text file as UTF-8 bytes, with the bytes of the file read so far.

    UTF-8 files are read as bytes (rows with bad bytes are reported one by one); a UTF-8 byte-order mark is dropped;
    UTF-16 files (PowerShell's ``>`` writes them) are decoded and re-encoded line by line.
    """
    if encoding != "utf-16":
        with path.open("rb", buffering=1 << 20) as handle:
            first = handle.readline()
            done = len(first)
            yield first.removeprefix(codecs.BOM_UTF8), done
            for raw in handle:
                done += len(raw)
                yield raw, done
        return
    with path.open("rb") as binary, io.TextIOWrapper(binary, encoding="utf-16", newline="") as text:
        try:
            for line in text:
                yield line.encode("utf-8"), binary.tell()
        except UnicodeDecodeError as exc:
            raise DatasetFileError(_not_text(path, encoding, exc), FileProblem.NOT_TEXT) from exc


def iter_jsonl(path: Path) -> Iterator[RawRow]:
    """Yields every non-blank line of a JSONL file (or the elements of a JSON array file).

    UTF-8 with or without a byte-order mark and UTF-16 with one (what Windows tools write) are read alike.
    """
    encoding = file_encoding(path)
    with path.open("rb") as probe:
        first = probe.read(4096).decode(encoding, "ignore").lstrip()
    if first.startswith("["):
        yield from iter_json_array(path, encoding)
        return
    for number, (raw, done) in enumerate(_utf8_lines(path, encoding), start=1):
        if number == 1 and raw.strip() == b"{":
            raise DatasetFileError(
                f"{path.name} is one pretty-printed JSON document, not JSON Lines (one object per line); "
                "export one object per line (for example: jq -c '.' FILE > FILE.jsonl)",
                FileProblem.PRETTY_JSON,
            )
        if raw.strip():
            yield _jsonl_row(number, raw, done)


def _csv_value(value: str) -> Any:
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        try:
            return json.loads(text)  # a 'messages' column stored as JSON text
        except json.JSONDecodeError:
            return value
    return value


def iter_csv(path: Path) -> Iterator[RawRow]:
    """Yields every data row of a CSV file with a header row (UTF-8, with or without a byte-order mark, or UTF-16)."""
    encoding = file_encoding(path)
    try:
        with path.open(newline="", encoding=encoding) as handle:
            for number, row in enumerate(csv.DictReader(handle), start=1):
                yield RawRow(number, {k: _csv_value(v or "") for k, v in row.items() if k}, None, handle.buffer.tell())  # type: ignore[attr-defined]
    except UnicodeDecodeError as exc:
        if encoding == "utf-16":
            raise DatasetFileError(_not_text(path, encoding, exc), FileProblem.NOT_TEXT) from exc
        raise DatasetFileError(
            f"{path} is not UTF-8 ({exc.reason}); re-save it as UTF-8", FileProblem.NOT_TEXT
        ) from exc
    except csv.Error as exc:
        raise DatasetFileError(f"{path} is not a readable CSV file ({exc})", FileProblem.NOT_CSV) from exc


def iter_parquet(path: Path) -> Iterator[RawRow]:
    """Yields every row of a Parquet file, a batch at a time."""
    try:
        import pyarrow.parquet as pq  # optional, heavy: only for Parquet input
    except ImportError as exc:
        raise DatasetFileError(
            "reading Parquet needs pyarrow: install the local tools (Models page, or rentune tools install)",
            FileProblem.NEEDS_PYARROW,
        ) from exc
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:
        raise DatasetFileError(f"{path} is not a readable Parquet file ({exc})", FileProblem.NOT_PARQUET) from exc
    number, total, rows = 0, path.stat().st_size, max(1, parquet.metadata.num_rows)
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield RawRow(number, row, None, total * number // rows)


#: Extensions read as plain text: the file's paragraphs are documents for continued pre-training.
TEXT_SUFFIXES = frozenset({".txt", ".text", ".md"})
#: The longest paragraph row, in characters: a text without blank lines is cut at a line break past this.
PARAGRAPH_CHARS = 20_000


def iter_text(path: Path) -> Iterator[RawRow]:
    """Yields the paragraphs of a plain-text file (blank lines between them) as ``{"text": ...}`` rows.

    Each row is numbered by its first line; a line that is not UTF-8 is a finding of its own (the rest of its
    paragraph is kept); a paragraph longer than :data:`PARAGRAPH_CHARS` is cut at a line break. UTF-8 with a
    byte-order mark and UTF-16 with one are read as JSONL files are.
    """
    done, start, size = 0, 0, 0
    paragraph: list[str] = []
    for number, (raw, done) in enumerate(_utf8_lines(path, file_encoding(path)), start=1):
        try:
            line = raw.decode("utf-8").replace("\r\n", "\n")
        except UnicodeDecodeError as bad:
            yield RawRow(number, None, Finding(Code.NOT_UTF8, number, f"byte {bad.start + 1} of the line"), done)
            continue
        if line.strip():
            start = start if paragraph else number
            paragraph.append(line)
            size += len(line)
        if paragraph and (not line.strip() or size > PARAGRAPH_CHARS):
            yield RawRow(start, {"text": "".join(paragraph).rstrip("\n")}, None, done)
            paragraph, size = [], 0
    if paragraph:
        yield RawRow(start, {"text": "".join(paragraph).rstrip("\n")}, None, done)


def iter_rows(path: Path) -> Iterator[RawRow]:
    """Yields the rows of a dataset file, chosen by its extension (.jsonl/.json, .csv, .parquet, .txt).

    Raises:
        DatasetFileError: The file is missing, of an unknown type, or unreadable as a whole.
    """
    if path.is_dir():
        raise DatasetFileError(
            f"{path} is a folder; pass the path of a JSONL, CSV, Parquet or .txt file inside it", FileProblem.FOLDER
        )
    if not path.is_file():
        raise DatasetFileError(
            f"{path} does not exist; pass the path of a JSONL, CSV, Parquet or .txt file", FileProblem.MISSING
        )
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".json", ".ndjson"}:
        return iter_jsonl(path)
    if suffix in {".csv", ".tsv"}:
        return iter_csv(path)
    if suffix in {".parquet", ".pq"}:
        return iter_parquet(path)
    if suffix in TEXT_SUFFIXES:
        return iter_text(path)
    raise DatasetFileError(
        f"{path.name}: unknown file type {suffix!r}; use .jsonl, .csv or .parquet (or .txt of raw text)",
        FileProblem.UNKNOWN_TYPE,
    )


def choose_format(
    row: Mapping[str, Any], mapping: Mapping[str, str] | None
) -> tuple[DataFormat, dict[str, str] | None]:
    """Picks the format from the first readable row (an explicit column mapping wins).

    Raises:
        DatasetFileError: No known format matches; the message lists what the row has.
    """
    if mapping:
        return DataFormat.COLUMNS, dict(mapping)
    detected = detect_format(row)
    if detected is not None:
        return detected, None
    guessed = guess_column_mapping(list(row))
    if guessed:
        return DataFormat.COLUMNS, guessed
    raise DatasetFileError(
        f"unknown row layout (fields: {', '.join(map(str, row))}); use 'messages', Alpaca "
        "(instruction/input/output), ShareGPT (conversations), prompt/completion, or map columns with "
        "--columns user=COL,assistant=COL",
        FileProblem.UNKNOWN_LAYOUT,
        [str(name) for name in row],
    )


def first_format(path: Path) -> DataFormat | None:
    """The format of a dataset file's first readable row (None when no row is readable or its layout is unknown).

    Reads only as far as that row: enough to tell conversations, preference pairs and raw text apart before
    anything is rented.

    Raises:
        DatasetFileError: The file is missing, of an unknown type, or unreadable as a whole.
    """
    rows = iter_rows(path)
    try:
        row = next((raw.data for raw in rows if raw.data is not None), None)
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()
    if row is None:
        return None
    try:
        return choose_format(row, None)[0]
    except DatasetFileError:
        return None
