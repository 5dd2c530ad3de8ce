"""Streaming rows out of JSONL, CSV and Parquet files, with the line (or row) number of each.

Nothing is read whole into memory: JSONL line by line, CSV row by row, Parquet batch by batch.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from desktop.core.data.findings import Code, Finding
from desktop.core.data.formats import DataFormat, detect_format, guess_column_mapping

_DECODER = msgspec.json.Decoder()


class DatasetFileError(ValueError):
    """The file as a whole cannot be read; the message says why and what to do."""


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


def iter_json_array(path: Path) -> Iterator[RawRow]:
    """Yields the elements of a file holding one JSON array (decoded at once: such files are rarely large)."""
    try:
        items = _DECODER.decode(path.read_bytes())
    except msgspec.DecodeError as exc:
        raise DatasetFileError(f"{path} is not valid JSON ({exc}); fix it or export it as JSON Lines") from exc
    done = path.stat().st_size
    for number, item in enumerate(items, start=1):
        if isinstance(item, dict):
            yield RawRow(number, item, None, done)
        else:
            yield RawRow(number, None, Finding(Code.WRONG_TYPE, number, "the element must be a JSON object"), done)


def iter_jsonl(path: Path) -> Iterator[RawRow]:
    """Yields every non-blank line of a JSONL file (or the elements of a JSON array file)."""
    with path.open("rb") as probe:
        first = probe.read(4096).lstrip()
    if first.startswith(b"["):
        yield from iter_json_array(path)
        return
    done = 0
    with path.open("rb", buffering=1 << 20) as handle:
        for number, raw in enumerate(handle, start=1):
            done += len(raw)
            if number == 1 and raw.strip() == b"{":
                raise DatasetFileError(
                    f"{path.name} is one pretty-printed JSON document, not JSON Lines (one object per line); "
                    "export one object per line (for example: jq -c '.' FILE > FILE.jsonl)"
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
    """Yields every data row of a CSV file with a header row."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            for number, row in enumerate(csv.DictReader(handle), start=1):
                yield RawRow(number, {k: _csv_value(v or "") for k, v in row.items() if k}, None, handle.buffer.tell())  # type: ignore[attr-defined]
    except UnicodeDecodeError as exc:
        raise DatasetFileError(f"{path} is not UTF-8 ({exc.reason}); re-save it as UTF-8") from exc
    except csv.Error as exc:
        raise DatasetFileError(f"{path} is not a readable CSV file ({exc})") from exc


def iter_parquet(path: Path) -> Iterator[RawRow]:
    """Yields every row of a Parquet file, a batch at a time."""
    try:
        import pyarrow.parquet as pq  # optional, heavy: only for Parquet input
    except ImportError as exc:
        raise DatasetFileError("reading Parquet needs pyarrow: pip install pyarrow (or make install-local)") from exc
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:
        raise DatasetFileError(f"{path} is not a readable Parquet file ({exc})") from exc
    number, total, rows = 0, path.stat().st_size, max(1, parquet.metadata.num_rows)
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield RawRow(number, row, None, total * number // rows)


def iter_rows(path: Path) -> Iterator[RawRow]:
    """Yields the rows of a dataset file, chosen by its extension (.jsonl/.json, .csv, .parquet).

    Raises:
        DatasetFileError: The file is missing, of an unknown type, or unreadable as a whole.
    """
    if not path.is_file():
        raise DatasetFileError(f"{path} does not exist; pass the path of a JSONL, CSV or Parquet file")
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".json", ".ndjson"}:
        return iter_jsonl(path)
    if suffix in {".csv", ".tsv"}:
        return iter_csv(path)
    if suffix in {".parquet", ".pq"}:
        return iter_parquet(path)
    raise DatasetFileError(f"{path.name}: unknown file type {suffix!r}; use .jsonl, .csv or .parquet")


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
        "--columns user=COL,assistant=COL"
    )
