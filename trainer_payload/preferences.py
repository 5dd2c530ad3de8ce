"""Reading preference pairs (prompt, chosen answer, rejected answer) for DPO and ORPO on the GPU machine.

Rows take TRL's shapes, in either form (plain text, or chat messages):

- ``prompt`` / ``chosen`` / ``rejected``: the prompt given once, each answer on its own. An answer that is a whole
  conversation repeating the prompt (as UltraFeedback's binarised rows are) has that prompt taken off.
- ``chosen`` / ``rejected`` alone, each a whole conversation: the prompt is the turns before the last one, which must
  be the same in both.

Each row becomes ``{"prompt", "chosen", "rejected"}`` as TRL's trainers read it. A row that cannot train (a side
missing, an answer empty, the two conversations differing before their answers) is a ``data`` error naming its line,
before any step is paid for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer_payload.dataset import ROLES
from trainer_payload.failures import DataError

Pair = dict[str, Any]


class RowProblemError(ValueError):
    """One row is not a usable pair; the message says what is wrong with it."""


def _messages(value: Any, side: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RowProblemError(f"'{side}' must be text or a non-empty list of messages")
    for index, message in enumerate(value, start=1):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RowProblemError(f"'{side}' message {index} needs a role of system, user, assistant or tool")
        if not isinstance(message.get("content"), str):
            raise RowProblemError(f"'{side}' message {index} needs string content")
    return value


def _answer(messages: list[dict[str, str]], side: str) -> list[dict[str, str]]:
    if messages[-1]["role"] != "assistant":
        raise RowProblemError(f"'{side}' must end with the assistant's answer")
    if not messages[-1]["content"].strip():
        raise RowProblemError(f"the {side} answer is empty")
    return messages


def _plain_pair(row: dict[str, Any]) -> Pair:
    prompt, chosen, rejected = row.get("prompt", ""), row["chosen"], row["rejected"]
    if not isinstance(prompt, str):
        raise RowProblemError("'prompt' must be text when the answers are text")
    for side, text in (("chosen", chosen), ("rejected", rejected)):
        if not text.strip():
            raise RowProblemError(f"the {side} answer is empty")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _after(prompt: list[dict[str, str]], answer: list[dict[str, str]]) -> list[dict[str, str]]:
    """The answer without the prompt's turns, when it repeats them first (a whole conversation per side)."""
    return answer[len(prompt) :] if len(answer) > len(prompt) and answer[: len(prompt)] == prompt else answer


def _chat_pair(row: dict[str, Any]) -> Pair:
    chosen = _answer(_messages(row["chosen"], "chosen"), "chosen")
    rejected = _answer(_messages(row["rejected"], "rejected"), "rejected")
    if "prompt" in row:
        prompt = _messages(row["prompt"], "prompt")
        return {"prompt": prompt, "chosen": _after(prompt, chosen), "rejected": _after(prompt, rejected)}
    if chosen[:-1] != rejected[:-1]:
        raise RowProblemError("the conversations differ before their answers: chosen and rejected need the same prompt")
    if len(chosen) < 2:
        raise RowProblemError("each conversation needs the prompt before its answer, or give 'prompt' on its own")
    return {"prompt": chosen[:-1], "chosen": chosen[-1:], "rejected": rejected[-1:]}


def pair_from_row(row: Any) -> Pair:
    """The pair of one decoded row, in TRL's ``prompt`` / ``chosen`` / ``rejected`` shape.

    Raises:
        RowProblemError: The row is not a usable pair; the message names the field.
    """
    if not isinstance(row, dict):
        raise RowProblemError("expected an object with 'chosen' and 'rejected'")
    missing = [side for side in ("chosen", "rejected") if side not in row or row[side] is None]
    if missing:
        raise RowProblemError(f"the {' and '.join(missing)} side is missing")
    if isinstance(row["chosen"], str) and isinstance(row["rejected"], str):
        return _plain_pair(row)
    return _chat_pair(row)


def _form(pair: Pair) -> str:
    return "plain text" if isinstance(pair["chosen"], str) else "chat messages"


def load_pairs(path: Path) -> list[Pair]:
    """Reads every pair of a preference JSONL file.

    Raises:
        DataError: The file is missing or empty, or a row is not a usable pair (named with its line).
    """
    if not path.is_file():
        raise DataError(f"{path} does not exist on the machine; upload the dataset again")
    pairs: list[Pair] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                pair = pair_from_row(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path.name}:{number}: invalid JSON ({exc.msg})") from exc
            except RowProblemError as exc:
                raise DataError(f"{path.name}:{number}: {exc}") from None
            if pairs and _form(pair) != _form(pairs[0]):
                raise DataError(
                    f"{path.name}:{number}: this pair is {_form(pair)} while the first is {_form(pairs[0])}: "
                    "give every pair in one form"
                )
            pairs.append(pair)
    if not pairs:
        raise DataError(f"{path.name} holds no pairs")
    return pairs
