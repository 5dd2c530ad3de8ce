"""The slice of a run's data a trial trains on, and the held-out chats whose answers it shows."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.runs.spec import RunSpec
from desktop.services.trial.errors import TrialError

#: Held-out chats whose first answers a trial shows.
ANSWERS = 3
#: Held-out chats written for a trainer's validation set.
VALID_ROWS = 8


@dataclass(frozen=True)
class HeldOut:
    """A chat the trial did not train on: its messages up to the last answer, and that answer."""

    messages: tuple[dict[str, str], ...]
    expected: str


@dataclass(frozen=True)
class TrialData:
    """The trial's data on disk.

    Attributes:
        folder: Holds ``train.jsonl`` and ``valid.jsonl``.
        rows: Chats in ``train.jsonl``.
        held_out: Chats to ask after training.
    """

    folder: Path
    rows: int
    held_out: tuple[HeldOut, ...]


def count_rows(path: Path) -> int:
    """Chats in a JSONL file (blocking).

    Raises:
        TrialError: The file cannot be read.
    """
    return sum(1 for _ in _chats(path))


def write_trial_data(spec: RunSpec, rows: int, folder: Path) -> TrialData:
    """Writes the first ``rows`` chats of the run's training data and held-out chats into ``folder`` (blocking).

    The held-out chats are the run's eval data when it has some, else the training chats after the slice.

    Raises:
        TrialError: The data cannot be read or holds no chat.
    """
    folder.mkdir(parents=True, exist_ok=True)
    chats = _chats(spec.train_file)
    train = list(itertools.islice(chats, rows))
    if not train:
        raise TrialError(f"{spec.train_file} holds no chat (JSON lines with messages); check it on the Data step")
    rest = list(_chats(spec.eval_file) if spec.eval_file else itertools.islice(chats, VALID_ROWS))
    valid = rest[:VALID_ROWS] or train[:VALID_ROWS]
    _write(folder / "train.jsonl", train)
    _write(folder / "valid.jsonl", valid)
    held_out = tuple(h for h in (_held_out(chat) for chat in valid[:ANSWERS]) if h is not None)
    return TrialData(folder, len(train), held_out)


def _chats(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                chat = _chat(line)
                if chat is not None:
                    yield chat
    except OSError as exc:
        raise TrialError(f"cannot read {path} ({exc.strerror or exc}); check the file on the Data step") from exc


def _chat(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    return {"messages": [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in messages]}


def _held_out(chat: dict[str, Any]) -> HeldOut | None:
    messages = chat["messages"]
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if not last:
        return None
    return HeldOut(tuple(messages[:last]), messages[last]["content"])


def _write(path: Path, chats: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(chat, ensure_ascii=False) + "\n" for chat in chats), encoding="utf-8")
