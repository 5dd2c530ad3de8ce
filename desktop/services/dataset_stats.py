"""Counting a chat dataset's training tokens for sizing, streaming, without a tokenizer.

This is a labelled estimate (about four characters per token, the usual figure for English text with modern BPE
vocabularies), capped per example at the sequence length as truncation would. It needs no ML libraries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CHARS_PER_TOKEN = 4.0
# Chat templates add role markers and separators around every message.
TEMPLATE_TOKENS_PER_MESSAGE = 4


class DatasetReadError(ValueError):
    """The dataset cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class DatasetTokens:
    """Token counts of a dataset.

    Attributes:
        examples: Rows read.
        tokens: Training tokens per epoch after truncation to the sequence length.
        truncated_examples: Rows longer than the sequence length.
        method: How the tokens were counted, for the user to see.
    """

    examples: int
    tokens: int
    truncated_examples: int
    method: str


def _row_text_and_messages(row: object, where: str) -> tuple[int, int]:
    if not isinstance(row, dict):
        raise DatasetReadError(f"{where}: each line must be a JSON object")
    if isinstance(row.get("messages"), list):
        parts = [m.get("content") or "" for m in row["messages"] if isinstance(m, dict)]
        return sum(len(str(p)) for p in parts), len(parts)
    if "conversations" in row and isinstance(row["conversations"], list):
        parts = [m.get("value") or "" for m in row["conversations"] if isinstance(m, dict)]
        return sum(len(str(p)) for p in parts), len(parts)
    texts = [str(v) for k, v in row.items() if k in {"instruction", "input", "output", "prompt", "completion", "text"}]
    if not texts:
        raise DatasetReadError(f"{where}: no 'messages', 'conversations' or instruction/prompt fields")
    return sum(len(t) for t in texts), len(texts)


def estimate_dataset_tokens(path: Path, seq_len: int) -> DatasetTokens:
    """Streams a JSONL chat dataset and estimates its training tokens per epoch.

    Raises:
        DatasetReadError: The file is missing, empty or has a malformed line (named with its number).
    """
    if not path.is_file():
        raise DatasetReadError(f"{path} does not exist; pass the path of a JSONL chat dataset")
    examples = tokens = truncated = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetReadError(f"{path}:{number}: invalid JSON ({exc.msg}); fix or remove the line") from exc
            chars, messages = _row_text_and_messages(row, f"{path}:{number}")
            length = round(chars / CHARS_PER_TOKEN) + TEMPLATE_TOKENS_PER_MESSAGE * messages
            truncated += length > seq_len
            tokens += min(length, seq_len)
            examples += 1
    if examples == 0:
        raise DatasetReadError(f"{path} holds no examples")
    return DatasetTokens(examples, tokens, truncated, "estimate: ~4 characters per token, no tokenizer used")
