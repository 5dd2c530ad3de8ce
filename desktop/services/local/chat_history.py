"""Chats kept per model, and a chat written as training data.

Each model (a file, with its LoRA if any) has its conversation saved in the app's data folder after every answer, so
choosing the model again brings the conversation back. :func:`export_training_jsonl` writes a conversation in the
chat format the data step reads (one ``{"messages": [...]}`` line), so a good conversation can become training data.
Blocking (small files); callers on the event loop use ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from desktop.services.local.chat import Conversation, Message
from desktop.services.platform.paths import app_paths

SCHEMA_VERSION = 1
_ROLES = ("user", "assistant")


def chats_folder() -> Path:
    """Where the saved chats are (one JSON file per model)."""
    return app_paths().data_dir / "chats"


def history_file(model: Path, lora: Path | None = None) -> Path:
    """The file the chat with ``model`` (and ``lora``) is saved in: its name, then a hash of both paths."""
    identity = f"{model.resolve()}\n{lora.resolve() if lora else ''}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", model.stem)[:60]
    return chats_folder() / f"{name}-{digest}.json"


def save_history(model: Path, lora: Path | None, conversation: Conversation) -> Path:
    """Saves the conversation with ``model`` (replacing the saved one, atomically); returns the file."""
    target = history_file(model, lora)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "schema_version": SCHEMA_VERSION,
        "model": str(model),
        "lora": str(lora) if lora else None,
        "system": conversation.system,
        "turns": conversation.turns,
    }
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    partial.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    partial.replace(target)
    return target


def load_history(model: Path, lora: Path | None = None) -> Conversation | None:
    """The saved conversation with ``model``, or None when there is none (or the file is not one the app wrote)."""
    try:
        data = json.loads(history_file(model, lora).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        return None
    turns = _turns(data.get("turns"))
    system = data.get("system")
    if turns is None or not (system is None or isinstance(system, str)):
        return None
    return Conversation(system, turns)


def _turns(value: Any) -> list[Message] | None:
    """Alternating user and assistant messages of text, or None when ``value`` is anything else."""
    if not isinstance(value, list) or len(value) % 2:
        return None
    turns: list[Message] = []
    for index, turn in enumerate(value):
        if not isinstance(turn, dict) or turn.get("role") != _ROLES[index % 2]:
            return None
        if not isinstance(turn.get("content"), str):
            return None
        turns.append({"role": turn["role"], "content": turn["content"]})
    return turns


def forget_history(model: Path, lora: Path | None = None) -> None:
    """Deletes the saved conversation with ``model`` (Clear)."""
    history_file(model, lora).unlink(missing_ok=True)


def training_line(conversation: Conversation) -> str:
    """The conversation as one line of chat training data: ``{"messages": [system?, user, assistant, ...]}``.

    Raises:
        ValueError: The conversation has no answered question yet.
    """
    if not conversation.turns:
        raise ValueError("the chat has no answer yet; ask something first")
    head = [{"role": "system", "content": conversation.system}] if conversation.system else []
    return json.dumps({"messages": [*head, *conversation.turns]}, ensure_ascii=False)


def export_training_jsonl(conversation: Conversation, path: Path) -> Path:
    """Adds the conversation as a line to the JSONL file ``path`` (created when absent); returns ``path``.

    Adding, not replacing, lets several good chats be collected into one training file.

    Raises:
        ValueError: The conversation has no answered question yet.
        OSError: The file cannot be written.
    """
    line = training_line(conversation)
    path.parent.mkdir(parents=True, exist_ok=True)
    starts_fresh = not path.exists() or path.stat().st_size == 0
    with path.open("a", encoding="utf-8") as handle:
        if not starts_fresh and not _ends_with_newline(path):
            handle.write("\n")
        handle.write(line + "\n")
    return path


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"
