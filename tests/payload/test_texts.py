"""Raw text for continued pre-training as the payload reads it: a .txt file as one document cut at paragraph breaks,
a .jsonl file one document per line, and each defect named."""

from __future__ import annotations

from pathlib import Path

import pytest

from desktop.services.runs.events import describe_event
from desktop.services.runs.transfer import remote_data_name
from trainer_payload.failures import DataError
from trainer_payload.texts import load_texts, pieces


def test_a_long_text_is_cut_at_paragraph_breaks_into_pieces_no_longer_than_the_limit() -> None:
    text = "\n\n".join(f"paragraph {n} " + "x" * 30 for n in range(10))
    cut = pieces(text, limit=100)
    assert all(len(piece) <= 100 for piece in cut) and all(piece.startswith("paragraph") for piece in cut)
    assert "".join(cut).replace("\n", "") == text.replace("\n", ""), "nothing lost but the breaks cut at"
    assert pieces("one line", limit=100) == ["one line"] and pieces("x" * 250, limit=100) == ["x" * 100] * 2 + [
        "x" * 50
    ]


def test_txt_and_jsonl_documents_are_read_and_their_defects_named(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text("First paragraph.\n\nSecond one.\n", encoding="utf-8")
    assert load_texts(tmp_path / "corpus.txt") == [{"text": "First paragraph.\n\nSecond one.\n"}]
    (tmp_path / "docs.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert load_texts(tmp_path / "docs.jsonl") == [{"text": "one"}, {"text": "two"}]
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "blank.txt").write_text("\n \n")
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"body": "two"}\n')
    for name, words in [
        ("latin1.txt", r"latin1\.txt: byte 3 is not UTF-8; save the file as UTF-8"),
        ("blank.txt", "blank.txt holds no text"),
        ("bad.jsonl", r"bad\.jsonl:2: expected an object with a non-empty 'text'"),
        ("missing.txt", "does not exist on the machine"),
    ]:
        with pytest.raises(DataError, match=words):
            load_texts(tmp_path / name)


def test_raw_text_keeps_its_suffix_on_the_machine_and_the_terminal_says_the_perplexity() -> None:
    assert remote_data_name(Path("/home/me/Corpus.TXT"), "train") == "data/train.txt"
    assert remote_data_name(Path("/home/me/chats.jsonl"), "eval") == "data/eval.jsonl"
    done = {"event": "done", "train_seconds": 3.1, "metrics": {"base_perplexity": 473.8, "perplexity": 280.58}}
    assert describe_event(done) == "done in 3.1 s of training; held-out perplexity 473.80 before training, 280.58 after"
    assert describe_event({"event": "done", "train_seconds": 3.1, "metrics": {}}) == "done in 3.1 s of training"
