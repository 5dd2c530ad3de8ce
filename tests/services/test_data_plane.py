"""The data plane on real files: the bad-file corpus, conversions, exact token counts, prepare and the CLI."""

from __future__ import annotations

import codecs
import csv
import errno
import json
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.data.formats import to_alpaca, to_prompt_completion, to_sharegpt
from desktop.services.data import prepare as data_prepare
from desktop.services.data.check import check_dataset
from desktop.services.data.prepare import PrepareError, prepare_dataset
from desktop.services.data.tokens import ChatTemplateTokenCounter, load_token_counter
from desktop.services.platform.files import sha256_file
from tests.fixtures.tiny_models import TinyModel

BAD = Path(__file__).resolve().parents[1] / "data" / "bad"
EXPECTED = json.loads((BAD / "expected.json").read_text())


def distinct_rows(count: int) -> list[list[dict[str, str]]]:
    return [
        [
            {"role": "system", "content": "You answer questions."},
            {"role": "user", "content": f"What is {i} times 3?"},
            {"role": "assistant", "content": f"{i} times 3 is {i * 3}."},
        ]
        for i in range(count)
    ]


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_defect_is_reported_at_its_line(name: str) -> None:
    seq_len = 512 if name == "too_long.jsonl" else 2048
    report = check_dataset(BAD / name, seq_len=seq_len).report
    found = sorted((s.code.value, line) for s in report.summaries.values() for line in s.lines)
    assert found == sorted((code, line) for code, line in EXPECTED[name])


def test_one_bad_line_among_ten_thousand(tmp_path: Path) -> None:
    rows = [{"messages": m} for m in distinct_rows(10_000)]
    path = tmp_path / "big.jsonl"
    lines = [json.dumps(r) for r in rows]
    lines[6_789] = '{"messages": [{"role": "user", "content": "no answer"}]}'
    path.write_text("\n".join(lines) + "\n")
    report = check_dataset(path).report
    assert {(s.code.value, tuple(s.lines)) for s in report.summaries.values()} == {("no-assistant", (6_790,))}
    assert report.rows == 10_000 and report.valid == 9_999


@pytest.mark.parametrize("convert", [to_alpaca, to_sharegpt, to_prompt_completion])
def test_converted_formats_prepare_to_the_same_messages(tmp_path: Path, convert: object) -> None:
    conversations = distinct_rows(40)
    source = write_jsonl(tmp_path / "in.jsonl", [convert(m) for m in conversations])  # type: ignore[operator]
    prepared = prepare_dataset(source, tmp_path / "out", eval_fraction=0)
    written = [json.loads(line)["messages"] for line in prepared.train.read_text().splitlines()]
    assert written == conversations


def test_csv_with_guessed_and_explicit_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "qa.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question", "answer", "topic"])
        writer.writerows([[f"Q{i}?", f"A{i}.", "x"] for i in range(20)])
    report = check_dataset(path).report
    assert report.valid == 20 and "columns" in report.format
    assert main(["data", "check", str(path), "--columns", "user=topic,assistant=answer", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid_rows"] == 20


def test_parquet_with_messages(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": m} for m in distinct_rows(30)]), path)
    report = check_dataset(path).report
    assert (report.rows, report.valid, report.errors) == (30, 30, 0)


def test_token_counts_equal_the_chat_template_tokenization(tiny_model: TinyModel, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    counter = load_token_counter(str(tiny_model.path))
    assert isinstance(counter, ChatTemplateTokenCounter)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model.path)
    conversations = distinct_rows(25)
    expected = [
        len(tokenizer.apply_chat_template(m, tokenize=True, return_dict=True)["input_ids"]) for m in conversations
    ]
    assert counter.count(conversations) == expected
    outcome = check_dataset(
        write_jsonl(tmp_path / "d.jsonl", [{"messages": m} for m in conversations]), counter=counter
    )
    assert sorted(outcome.lengths.values()) == sorted(expected)
    assert outcome.report.tokens is not None and "tokenizer and chat template" in outcome.report.tokens.method


def test_without_a_tokenizer_the_estimate_is_labelled() -> None:
    assert "estimate" in load_token_counter(None).description
    assert "could not be loaded" in load_token_counter("nobody/not-a-cached-model").description


def test_prepare_writes_splits_and_a_manifest(tmp_path: Path) -> None:
    rows = [{"messages": m} for m in distinct_rows(200)]
    rows += [rows[0], {"messages": [{"role": "user", "content": "x"}]}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    first = prepare_dataset(source, tmp_path / "a", eval_fraction=0.1, seed=3)
    again = prepare_dataset(source, tmp_path / "b", eval_fraction=0.1, seed=3)
    assert first.train.read_bytes() == again.train.read_bytes()
    assert first.eval is not None and again.eval is not None
    assert first.eval.read_bytes() == again.eval.read_bytes()
    manifest = json.loads(first.manifest.read_text())
    assert manifest["source"]["sha256"] == sha256_file(source)
    assert manifest["counts"] == {"rows": 202, "with_errors": 1, "duplicates_removed": 1, "train": 180, "eval": 20}
    assert manifest["files"]["train.jsonl"] == sha256_file(first.train)
    assert manifest["tokens"]["trained_per_epoch"] > 0
    assert not list((tmp_path / "a").glob("*.part"))


def test_prepare_refuses_unusable_input(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match="no row is usable"):
        prepare_dataset(
            BAD / "not_an_object.jsonl" if False else write_jsonl(tmp_path / "x.jsonl", [{"messages": "nope"}]),
            tmp_path / "out",
        )
    with pytest.raises(PrepareError, match="eval-fraction"):
        prepare_dataset(BAD / "duplicate.jsonl", tmp_path / "out", eval_fraction=0.9)


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["check", str(BAD / "duplicate.jsonl")], 0, "exact duplicates"),
        (["check", str(BAD / "mixed.jsonl")], 1, "invalid JSON"),
        (["check", "missing.jsonl"], 2, "does not exist"),
        (["check", str(BAD / "expected.json")], 2, "not JSON Lines"),
        (["check", str(BAD / "mixed.jsonl"), "--seq-len", "0"], 2, "--seq-len 0 is out of range"),
    ],
)
def test_data_check_exit_codes(args: list[str], code: int, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", *args]) == code
    captured = capsys.readouterr()
    assert text in captured.out + captured.err
    assert "Traceback" not in captured.err


def test_unknown_layout_and_json_arrays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "check", str(write_jsonl(tmp_path / "x.jsonl", [{"foo": 1}]))]) == 2
    assert "unknown row layout (fields: foo)" in capsys.readouterr().err
    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"messages": m} for m in distinct_rows(5)], indent=2))
    assert main(["data", "check", str(array)]) == 0


def test_data_prepare_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"messages": m} for m in distinct_rows(60)])
    assert main(["data", "prepare", str(source), "--out", str(tmp_path / "out"), "--eval-fraction", "0.1"]) == 0
    assert "Wrote 54 training and 6 eval examples" in capsys.readouterr().out
    assert main(["data", "prepare", str(source), "--out", str(tmp_path / "o2"), "--eval-fraction", "2"]) == 2


# -- files saved by Windows tools: a UTF-8 byte-order mark, UTF-16 from PowerShell's `>` -----------------------------

WINDOWS_ENCODINGS = {
    "utf-8-bom": lambda text: codecs.BOM_UTF8 + text.encode("utf-8"),
    "utf-16-le": lambda text: codecs.BOM_UTF16_LE + text.encode("utf-16-le"),
    "utf-16-be": lambda text: codecs.BOM_UTF16_BE + text.encode("utf-16-be"),
}


def accented_rows(count: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Où est la gare n°{i}?"}, {"role": "assistant", "content": f"Là-bas, {i} €."}]
        for i in range(count)
    ]


@pytest.mark.parametrize("encoding", sorted(WINDOWS_ENCODINGS))
def test_jsonl_saved_by_windows_tools_is_read_and_prepared(encoding: str, tmp_path: Path) -> None:
    conversations = accented_rows(30)
    text = "".join(json.dumps({"messages": m}, ensure_ascii=False) + "\r\n" for m in conversations)
    path = tmp_path / "chat.jsonl"
    path.write_bytes(WINDOWS_ENCODINGS[encoding](text))
    report = check_dataset(path).report
    assert (report.rows, report.valid, report.errors, report.fatal) == (30, 30, 0, "")
    assert report.summaries == {}
    prepared = prepare_dataset(path, tmp_path / "out", eval_fraction=0)
    written = [json.loads(line)["messages"] for line in prepared.train.read_text(encoding="utf-8").splitlines()]
    assert written == conversations


@pytest.mark.parametrize("encoding", sorted(WINDOWS_ENCODINGS))
def test_json_array_saved_by_windows_tools_is_read(encoding: str, tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    text = json.dumps([{"messages": m} for m in accented_rows(5)], ensure_ascii=False, indent=2)
    path.write_bytes(WINDOWS_ENCODINGS[encoding](text))
    assert check_dataset(path).report.valid == 5


@pytest.mark.parametrize("encoding", sorted(WINDOWS_ENCODINGS))
def test_csv_saved_by_windows_tools_is_read_with_its_header(
    encoding: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "qa.csv"
    lines = ["question,answer"] + [f"Où est {i}?,Là-bas {i} €." for i in range(20)]
    path.write_bytes(WINDOWS_ENCODINGS[encoding]("\r\n".join(lines) + "\r\n"))
    outcome = check_dataset(path)
    assert (outcome.report.rows, outcome.report.valid, outcome.report.errors) == (20, 20, 0)
    assert outcome.mapping == {"user": "question", "assistant": "answer"}, "the header has no byte-order mark"
    assert main(["data", "prepare", str(path), "--out", str(tmp_path / "out"), "--eval-fraction", "0"]) == 0
    first = json.loads((tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first["messages"] == [
        {"role": "user", "content": "Où est 0?"},
        {"role": "assistant", "content": "Là-bas 0 €."},
    ]
    assert "Wrote 20 training" in capsys.readouterr().out


def test_broken_utf16_is_one_finding_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    good = json.dumps({"messages": accented_rows(1)[0]}, ensure_ascii=False) + "\r\n"
    path.write_bytes(codecs.BOM_UTF16_LE + good.encode("utf-16-le") + b"\x00\xd8" + b"x\x00")  # a lone surrogate
    report = check_dataset(path).report
    assert "starts like UTF-16 text but is not valid UTF-16" in report.fatal
    assert report.fatal.endswith("save it again as UTF-8")


# -- prepare writes its set atomically, the manifest last ----------------------------------------------------------


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_a_prepare_that_fails_midway_keeps_the_previous_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    prepare_dataset(write_jsonl(tmp_path / "old.jsonl", [{"messages": m} for m in distinct_rows(60)]), out)
    before = folder_bytes(out)
    assert sorted(before) == ["eval.jsonl", "manifest.json", "train.jsonl"]
    real_sha256, hashed = data_prepare.sha256_file, []

    def fail_after_the_new_train_file(path: Path) -> str:
        hashed.append(path)
        if len(hashed) == 2:  # 1: the source; 2: the new train.jsonl, written in full
            raise OSError(errno.EIO, "Input/output error")
        return real_sha256(path)

    monkeypatch.setattr(data_prepare, "sha256_file", fail_after_the_new_train_file)
    newer = write_jsonl(tmp_path / "new.jsonl", [{"messages": m} for m in distinct_rows(90)])
    with pytest.raises(PrepareError, match=r"could not be written to .*Input/output error"):
        prepare_dataset(newer, out)
    assert hashed[1].name == "train.jsonl" and hashed[1].parent != out
    assert folder_bytes(out) == before, "the previous set is intact, and nothing new (not even a hidden folder) is left"


def test_a_prepare_interrupted_while_moving_the_set_in_leaves_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    source = write_jsonl(tmp_path / "in.jsonl", [{"messages": m} for m in distinct_rows(60)])
    prepare_dataset(source, out)
    real_replace = Path.replace

    def crash_on_the_eval_move(self: Path, target: Path) -> Path:
        if Path(target) == out / "eval.jsonl":
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", crash_on_the_eval_move)
    with pytest.raises(PrepareError):
        prepare_dataset(source, out, seed=7)
    assert not (out / "manifest.json").exists(), "no manifest vouches for a half-moved set"


def test_a_prepare_without_eval_removes_the_old_eval_split(tmp_path: Path) -> None:
    out = tmp_path / "out"
    source = write_jsonl(tmp_path / "in.jsonl", [{"messages": m} for m in distinct_rows(60)])
    assert prepare_dataset(source, out, eval_fraction=0.1).eval is not None
    again = prepare_dataset(source, out, eval_fraction=0)
    assert again.eval is None
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train.jsonl"]
    assert set(json.loads(again.manifest.read_text())["files"]) == {"train.jsonl"}
