"""Dataset formats and the conversion of chat rows to ``messages`` rows (the format of TRL, Unsloth and Axolotl).

Supported: ``messages`` (OpenAI/TRL chat), Alpaca (``instruction``/``input``/``output``), ShareGPT
(``conversations`` with ``from``/``value``), prompt/completion (strings or message lists), and tabular rows with a
column mapping (CSV, Parquet); preference pairs (prompt / chosen / rejected); raw text for continued pre-training
(``{"text": ...}`` rows, or the paragraphs of a ``.txt`` file).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from trainer_payload.protocol import is_pair_row

Message = dict[str, Any]


class DataFormat(StrEnum):
    """Row layouts Rentune reads."""

    MESSAGES = "messages"
    ALPACA = "alpaca"
    SHAREGPT = "sharegpt"
    PROMPT_COMPLETION = "prompt-completion"
    COLUMNS = "columns"
    PAIRS = "pairs"
    TEXT = "text"


FORMAT_NAMES = {
    DataFormat.MESSAGES: "chat messages (TRL/OpenAI 'messages')",
    DataFormat.ALPACA: "Alpaca (instruction/input/output)",
    DataFormat.SHAREGPT: "ShareGPT (conversations from/value)",
    DataFormat.PROMPT_COMPLETION: "prompt/completion",
    DataFormat.COLUMNS: "table columns mapped to roles",
    DataFormat.PAIRS: "preference pairs (prompt / chosen / rejected)",
    DataFormat.TEXT: "raw text (documents for continued pre-training)",
}

#: The chat fields whose presence makes a row with a ``text`` field something else than a raw text document.
_CHAT_FIELDS = frozenset({"messages", "conversations", "instruction", "prompt", "completion", "output"})

SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "tool": "tool",
    "function_call": "assistant",
    "observation": "tool",
    "function": "tool",
}


#: The objective each kind of data trains with when none is chosen (chats: ``sft``).
_OBJECTIVE_OF = {DataFormat.PAIRS: "dpo", DataFormat.TEXT: "cpt"}
#: What each objective trains on, in words.
TRAINS_ON = {"sft": "conversations", "dpo": "preference pairs", "orpo": "preference pairs", "cpt": "raw text"}


def objective_for(fmt: DataFormat) -> str:
    """The objective data of this format trains with by default: DPO for pairs, CPT for raw text, else SFT."""
    return _OBJECTIVE_OF.get(fmt, "sft")


def objective_data_problem(objective: str, fmt: DataFormat) -> str:
    """Why data of format ``fmt`` cannot train ``objective``, with the fix ("" when it can)."""
    wanted = objective_for(fmt)
    if wanted == objective or (fmt is DataFormat.PAIRS and objective == "orpo"):
        return ""
    needs = TRAINS_ON.get(objective, objective)
    return (
        f'objective "{objective}" trains on {needs}, and the data holds {FORMAT_NAMES[fmt]}: set [training] '
        f'objective = "{wanted}", or give [data] train a file of {needs}'
    )


class ConversionError(ValueError):
    """A row does not have the fields of its format; the message names the missing or mistyped field."""


#: Each format and the fields that make a row one, tried in order (pairs are told apart first).
_FORMAT_FIELDS = (
    (DataFormat.MESSAGES, {"messages"}),
    (DataFormat.SHAREGPT, {"conversations"}),
    (DataFormat.ALPACA, {"instruction", "output"}),
    (DataFormat.PROMPT_COMPLETION, {"prompt", "completion"}),
)


def detect_format(row: Mapping[str, Any]) -> DataFormat | None:
    """Guesses the format from one row's keys; ``None`` when it matches none."""
    if is_pair_row(row):
        return DataFormat.PAIRS
    found = next((fmt for fmt, fields in _FORMAT_FIELDS if fields <= row.keys()), None)
    if found is None and "text" in row and not _CHAT_FIELDS & set(row):
        return DataFormat.TEXT
    return found


def _text(row: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    value = row.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ConversionError(f"'{key}' must be a string, got {type(value).__name__}")
    return value


def from_alpaca(row: Mapping[str, Any]) -> list[Message]:
    """Alpaca → messages: optional system, the instruction (plus input) as user, the output as assistant."""
    instruction, extra = _text(row, "instruction"), _text(row, "input", required=False)
    user = f"{instruction}\n\n{extra}" if extra else instruction
    system = _text(row, "system", required=False)
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": user}, {"role": "assistant", "content": _text(row, "output")}]


def from_sharegpt(row: Mapping[str, Any]) -> list[Message]:
    """ShareGPT → messages, mapping ``from`` names (human, gpt...) to roles; unknown names are kept as they are."""
    turns = row.get("conversations")
    if not isinstance(turns, list):
        raise ConversionError("'conversations' must be a list")
    messages = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise ConversionError(f"conversations[{index}] must be an object with 'from' and 'value'")
        speaker = turn.get("from")
        role = SHAREGPT_ROLES.get(speaker, speaker) if isinstance(speaker, str) else speaker
        messages.append({"role": role, "content": turn.get("value")})
    return messages


def _as_messages(value: Any, default_role: str, key: str) -> list[Message]:
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, list):
        return [dict(m) if isinstance(m, Mapping) else {"role": None, "content": m} for m in value]
    raise ConversionError(f"'{key}' must be a string or a list of messages")


def from_prompt_completion(row: Mapping[str, Any]) -> list[Message]:
    """Prompt/completion (plain strings or TRL's conversational lists) → messages."""
    return [
        *_as_messages(row.get("prompt"), "user", "prompt"),
        *_as_messages(row.get("completion"), "assistant", "completion"),
    ]


def from_columns(row: Mapping[str, Any], mapping: Mapping[str, str]) -> list[Message]:
    """A table row → messages, with ``mapping`` from role (system/user/assistant) to column name."""
    messages = []
    for role in ("system", "user", "assistant"):
        column = mapping.get(role)
        if column is None:
            continue
        if column not in row:
            raise ConversionError(f"column '{column}' (mapped to {role}) is missing")
        value = row[column]
        if role == "system" and (value is None or value == ""):
            continue
        messages.append({"role": role, "content": value if value is None or isinstance(value, str) else str(value)})
    return messages


def to_messages(row: Mapping[str, Any], fmt: DataFormat, mapping: Mapping[str, str] | None = None) -> Any:
    """Converts one row of format ``fmt`` to its ``messages`` value (validated later by the row checks).

    Raises:
        ConversionError: The row lacks its format's fields.
    """
    if fmt is DataFormat.MESSAGES:
        return row.get("messages")
    if fmt is DataFormat.ALPACA:
        return from_alpaca(row)
    if fmt is DataFormat.SHAREGPT:
        return from_sharegpt(row)
    if fmt is DataFormat.PROMPT_COMPLETION:
        return from_prompt_completion(row)
    if fmt is DataFormat.PAIRS:
        raise ConversionError("a preference pair is not one conversation: it is read as a pair")
    return from_columns(row, mapping or {})


def guess_column_mapping(columns: list[str]) -> dict[str, str] | None:
    """Picks role columns from common names (instruction/output, question/answer, prompt/response...)."""
    lower = {c.lower(): c for c in columns}
    pairs = [
        ("instruction", "output"),
        ("prompt", "completion"),
        ("prompt", "response"),
        ("question", "answer"),
        ("input", "output"),
        ("user", "assistant"),
        ("query", "response"),
    ]
    for user, assistant in pairs:
        if user in lower and assistant in lower:
            mapping = {"user": lower[user], "assistant": lower[assistant]}
            for system in ("system", "system_prompt"):
                if system in lower:
                    mapping["system"] = lower[system]
            return mapping
    return None


def to_alpaca(messages: list[Message]) -> dict[str, str]:
    """Messages (optional system, one user, one assistant) → an Alpaca row."""
    by_role = {m["role"]: m["content"] for m in messages}
    row = {"instruction": by_role["user"], "input": "", "output": by_role["assistant"]}
    return {**row, "system": by_role["system"]} if "system" in by_role else row


def to_sharegpt(messages: list[Message]) -> dict[str, list[dict[str, str]]]:
    """Messages → a ShareGPT row."""
    names = {"user": "human", "assistant": "gpt", "system": "system", "tool": "observation"}
    return {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in messages]}


def to_prompt_completion(messages: list[Message]) -> dict[str, list[Message]]:
    """Messages → TRL's conversational prompt/completion (the last assistant turn is the completion)."""
    return {"prompt": messages[:-1], "completion": messages[-1:]}
