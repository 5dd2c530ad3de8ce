"""Reading the uploaded ``messages`` JSONL on the GPU machine, with the checks training depends on.

The desktop app checks data before renting; this second look costs seconds and turns a bad row into a ``data``
error with its line number instead of a crash mid-run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer_payload.failures import DataError

ROLES = {"system", "user", "assistant", "tool"}


def _row_problem(row: Any) -> str | None:
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or not messages:
        return "expected an object with a non-empty 'messages' list"
    for index, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"message {index} needs a role of system, user, assistant or tool"
        if not isinstance(message.get("content"), str):
            return f"message {index} needs string content"
    if messages[-1]["role"] != "assistant":
        return "the conversation must end with an assistant message"
    return None


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Each non-blank line of an uploaded JSONL file, decoded, with its line number.

    Raises:
        DataError: The file is missing, or a line is not JSON (named with its line).
    """
    if not path.is_file():
        raise DataError(f"{path} does not exist on the machine; upload the dataset again")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path.name}:{number}: invalid JSON ({exc.msg})") from exc
            yield number, row


def load_messages(path: Path) -> list[dict[str, Any]]:
    """Reads every row of a ``messages`` JSONL file.

    Raises:
        DataError: The file is missing or empty, or a row is malformed (named with its line).
    """
    rows = []
    for number, row in jsonl_rows(path):
        problem = _row_problem(row)
        if problem:
            raise DataError(f"{path.name}:{number}: {problem}")
        rows.append({"messages": row["messages"]})
    if not rows:
        raise DataError(f"{path.name} holds no examples")
    return rows
