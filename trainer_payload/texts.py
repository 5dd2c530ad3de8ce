"""Reading raw text for continued pre-training (``objective = "cpt"``) on the GPU machine.

A ``.txt`` file is one document, handed to the trainer in pieces of about a million characters cut at paragraph
breaks (a whole corpus in one string would be tokenised in one call); a ``.jsonl`` file is one document per line,
``{"text": "..."}``. The trainer packs the documents into sequences of ``seq_len`` tokens.
"""

from __future__ import annotations

from pathlib import Path

from trainer_payload.dataset import jsonl_rows
from trainer_payload.failures import DataError

#: The longest piece of a ``.txt`` document handed over at once, in characters.
PIECE_CHARS = 1_000_000


def pieces(text: str, limit: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into pieces of at most ``limit`` characters, at a paragraph break where there is one."""
    out = []
    while len(text) > limit:
        cut = text.rfind("\n\n", 0, limit)
        cut = cut if cut > limit // 2 else limit
        out.append(text[:cut])
        text = text[cut:].lstrip("\n")
    return [*out, text] if text.strip() else out


def _plain(path: Path) -> list[dict[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path.name}: byte {exc.start} is not UTF-8; save the file as UTF-8") from exc
    if not text.strip():
        raise DataError(f"{path.name} holds no text")
    return [{"text": piece} for piece in pieces(text)]


def _lines(path: Path) -> list[dict[str, str]]:
    rows = []
    for number, row in jsonl_rows(path):
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{path.name}:{number}: expected an object with a non-empty 'text'")
        rows.append({"text": text})
    if not rows:
        raise DataError(f"{path.name} holds no documents")
    return rows


def load_texts(path: Path) -> list[dict[str, str]]:
    """The documents of a ``.txt`` or ``.jsonl`` file as ``{"text": ...}`` rows.

    Raises:
        DataError: The file is missing, empty or not UTF-8, or a line is not a document (named with its line).
    """
    if not path.is_file():
        raise DataError(f"{path} does not exist on the machine; upload the dataset again")
    return _plain(path) if path.suffix.lower() == ".txt" else _lines(path)
