"""The data check and preparation of raw text for continued pre-training: a .txt file's paragraphs or a JSONL of
documents, planted defects named by line, tokens counted as packing trains them (nothing cut), the held-out text
taken from the end of a running text, and the prepared files read by the payload's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.data.findings import Code
from desktop.services.data.check import check_dataset
from desktop.services.data.prepare import prepare_dataset
from desktop.services.data.tokens import EstimatedTokenCounter
from desktop.services.data.workspace import check_and_prepare
from tests.fixtures.domain_text import domain_text
from trainer_payload.texts import load_texts


def write_text_with_defects(path: Path) -> tuple[Path, list[str]]:
    """Ten paragraphs, then the first again, one line in Latin-1 and one paragraph with an e-mail address."""
    paragraphs = domain_text(10).split("\n\n")
    body = "\n\n".join(paragraphs) + "\n\n" + paragraphs[0] + "\n\n"
    raw = body.encode() + "Caf\xe9 au lait.\n".encode("latin-1") + b"\nWrite to ada@example.com for more.\n"
    path.write_bytes(raw)
    return path, paragraphs


def test_a_text_files_paragraphs_are_checked_by_line_and_counted_as_packed(tmp_path: Path) -> None:
    path, paragraphs = write_text_with_defects(tmp_path / "corpus.txt")
    outcome = check_dataset(path, seq_len=64)
    report = outcome.report
    assert report.format.startswith("raw text") and outcome.fmt is not None and outcome.fmt.value == "text"
    assert report.summaries[Code.DUPLICATE].lines == [21] and report.summaries[Code.NOT_UTF8].lines == [23]
    assert report.summaries[Code.EMAIL].lines == [25]
    assert Code.TOO_LONG not in report.summaries, "packed text is never cut, however long a paragraph"
    tokens = report.tokens
    assert tokens is not None and tokens.cut == 0 and tokens.trained == tokens.total
    counted = EstimatedTokenCounter().count_text([*paragraphs, paragraphs[0], "Write to ada@example.com for more."])
    assert tokens.total == sum(counted), "every readable paragraph, the repeat too (preparing leaves it out)"


def test_prepare_writes_the_running_text_back_whole_and_holds_out_its_end(tmp_path: Path) -> None:
    paragraphs = domain_text(40).split("\n\n")
    source = tmp_path / "book.txt"
    source.write_text("\n\n".join([*paragraphs[:20], paragraphs[3], *paragraphs[20:]]) + "\n")
    prepared = prepare_dataset(source, tmp_path / "prepared", seq_len=128, eval_fraction=0.1)
    train, held_out = load_texts(prepared.train), load_texts(prepared.eval or Path("missing"))
    assert len(train) == 1 and len(held_out) == 1, "one running document each, not one per paragraph"
    assert train[0]["text"] == "\n\n".join(paragraphs[:36]), "the repeated paragraph is left out, the text runs on"
    assert held_out[0]["text"] == "\n\n".join(paragraphs[36:]), "the last tenth of the tokens is held out"
    manifest = prepared.manifest_data
    assert manifest["format"] == "text" and manifest["counts"] == {
        "rows": 41, "with_errors": 0, "duplicates_removed": 1, "train": 36, "eval": 4
    }  # fmt: skip
    tokens = EstimatedTokenCounter().count_text(paragraphs[:36])
    assert manifest["tokens"]["train_per_epoch"] == sum(tokens) and manifest["tokens"]["cut"] == 0


def test_a_jsonl_of_documents_is_split_by_document_and_an_empty_one_is_an_error(tmp_path: Path) -> None:
    documents = [{"text": f"Document {n}. " + domain_text(1, seed=n)} for n in range(30)]
    documents[4] = {"text": "   "}
    documents[7] = {"text": 42}
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in documents))
    outcome = check_dataset(source)
    assert outcome.report.summaries[Code.EMPTY_CONTENT].lines == [5]
    assert outcome.report.summaries[Code.WRONG_TYPE].lines == [8]
    prepared = prepare_dataset(source, tmp_path / "prepared", eval_fraction=0.1)
    rows = load_texts(prepared.train) + load_texts(prepared.eval or Path("missing"))
    assert sorted(r["text"] for r in rows) == sorted(d["text"] for d in documents if isinstance(d["text"], str) and
                                                     d["text"].strip())  # fmt: skip
    assert prepared.manifest_data["counts"]["eval"] == 3


def test_rentune_data_check_of_raw_text_speaks_of_paragraphs_and_packing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = write_text_with_defects(tmp_path / "corpus.txt")
    assert main(["data", "check", str(path), "--seq-len", "64"]) == 1  # the Latin-1 line is an error
    out = capsys.readouterr().out
    assert "raw text (documents for continued pre-training); 13 paragraphs or documents, 12 without errors" in out
    assert "packed into sequences of 64 tokens: a long document runs on into the next, nothing is cut" in out
    assert "not valid UTF-8" in out or "not UTF-8" in out


def test_the_wizard_prepares_raw_text_and_previews_its_paragraphs(tmp_path: Path) -> None:
    source = tmp_path / "corpus.txt"
    source.write_text(domain_text(12))
    check = check_and_prepare(source, seq_len=256)
    assert check.usable and check.data_format == "text"
    assert [m["role"] for m in check.preview[0]] == ["text"]
    assert check.preview[0][0]["content"] == domain_text(12).split("\n\n")[0]


def test_comparing_on_raw_text_says_how_continued_pretraining_is_measured_instead(tmp_path: Path) -> None:
    from desktop.services.local.common import LocalInputError
    from desktop.services.local.compare import read_eval_rows

    held_out = tmp_path / "held.txt"
    held_out.write_text(domain_text(3))
    with pytest.raises(LocalInputError, match=r"held\.txt holds raw text .* held-out perplexity before and after"):
        read_eval_rows(held_out, 50)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_a_text_file_written_by_windows_tools_is_read_like_utf8(tmp_path: Path, encoding: str) -> None:
    source = tmp_path / "notes.txt"
    text = domain_text(3).replace("\n", "\r\n")
    source.write_bytes(text.encode(encoding))
    outcome = check_dataset(source)
    assert outcome.report.valid == 3 and not outcome.report.summaries, outcome.report.summaries
    prepared = prepare_dataset(source, tmp_path / "prepared", eval_fraction=0)
    assert load_texts(prepared.train)[0]["text"] == domain_text(3)
