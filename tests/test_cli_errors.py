"""Every command, given bad input or an unreachable machine, exits non-zero with one line naming problem and fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.runs.store import RunStore


@dataclass(frozen=True)
class BadInputs:
    """Files and runs that commands must refuse in words."""

    missing: Path
    folder: Path
    latin1_spec: Path
    latin1_data: Path
    good_data: Path
    a_file: Path
    tmp: Path

    def spec(self, name: str, extra: str) -> Path:
        """A spec that is valid except for ``extra`` (TOML appended at the end)."""
        path = self.tmp / name
        path.write_text(
            f'[model]\nbase = "org/model"\n\n[data]\ntrain = "{self.good_data}"\n\n'
            f'[target]\nssh = "ssh://nobody@127.0.0.1:1"\n\n{extra}\n',
            encoding="utf-8",
        )
        return path


@pytest.fixture
def bad(tmp_path: Path, chat_dataset: Path) -> BadInputs:
    (tmp_path / "folder").mkdir()
    latin1_spec = tmp_path / "latin1.toml"
    latin1_spec.write_bytes('[model]\nbase = "café"\n'.encode("latin-1"))
    latin1_data = tmp_path / "latin1.jsonl"
    row = '{"messages": [{"role": "user", "content": "Où?"}, {"role": "assistant", "content": "Là."}]}\n'
    latin1_data.write_bytes((row * 3).encode("latin-1"))
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not a folder\n")
    return BadInputs(
        tmp_path / "missing.toml", tmp_path / "folder", latin1_spec, latin1_data, chat_dataset, a_file, tmp_path
    )


def unreachable_run() -> str:
    """A run recorded as training on a machine where nothing listens any more (a closed loopback port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = RunStore()
    record = store.create({"base_model": "m", "train_file": "t", "python": "python3"}, f"ssh://nobody@127.0.0.1:{port}")
    store.transition(record.id, RunState.TRAINING)
    store.update(record.id, pid=4242, remote_dir="/tmp/rentune-gone")
    return record.id


Case = Callable[[BadInputs], list[str]]
CASES: list[tuple[str, Case, str]] = [
    ("run-missing-spec", lambda b: ["run", str(b.missing)], "does not exist"),
    ("run-spec-is-a-folder", lambda b: ["run", str(b.folder)], "is a folder; pass the SPEC.toml file"),
    ("run-spec-not-utf8", lambda b: ["run", str(b.latin1_spec)], "is not UTF-8 text"),
    ("run-max-usd-ten", lambda b: ["run", str(b.spec("s.toml", '[budget]\nmax_usd = "ten"'))], "[budget] max_usd"),
    (
        "run-seq-len-long",
        lambda b: ["run", str(b.spec("s.toml", '[training]\nseq_len = "long"'))],
        "[training] seq_len = 'long' must be a whole number, like seq_len = 2048",
    ),
    (
        "run-epochs-three",
        lambda b: ["run", str(b.spec("s.toml", '[training]\nepochs = "three"'))],
        "[training] epochs = 'three' must be a number",
    ),
    (
        "run-identity-missing",
        lambda b: ["run", str(b.spec("s.toml", "")), "--identity", str(b.missing)],
        "is not a file; pass your private key file",
    ),
    ("check-missing", lambda b: ["data", "check", str(b.tmp / "missing.jsonl")], "does not exist"),
    ("check-folder", lambda b: ["data", "check", str(b.folder)], "is a folder"),
    ("check-not-utf8", lambda b: ["data", "check", str(b.latin1_data)], "no row is usable"),
    ("check-seq-len-long", lambda b: ["data", "check", str(b.good_data), "--seq-len", "long"], "--seq-len"),
    ("prepare-missing", lambda b: ["data", "prepare", str(b.tmp / "x.jsonl"), "--out", str(b.tmp / "o")], "exist"),
    ("prepare-folder", lambda b: ["data", "prepare", str(b.folder), "--out", str(b.tmp / "o")], "is a folder"),
    (
        "prepare-not-utf8",
        lambda b: ["data", "prepare", str(b.latin1_data), "--out", str(b.tmp / "o")],
        "no row is usable",
    ),
    (
        "prepare-out-is-a-file",
        lambda b: ["data", "prepare", str(b.good_data), "--out", str(b.a_file)],
        "is a file; choose a folder",
    ),
    ("plan-dataset-folder", lambda b: ["plan", "--model", "llama-3.1-8b", "--dataset", str(b.folder)], "is a folder"),
    (
        "plan-dataset-not-utf8",
        lambda b: ["plan", "--model", "llama-3.1-8b", "--dataset", str(b.latin1_data)],
        "no row is usable",
    ),
    ("plan-model-folder-without-config", lambda b: ["plan", "--model", str(b.folder)], "config.json"),
    *[
        (f"{command}-unknown-run", lambda b, c=command: [c, "nope"], "no run matches 'nope'")
        for command in ("status", "logs", "stop", "pull", "resume")
    ],
]


def assert_one_line_error(code: int, err: str, expected: str) -> None:
    assert code != 0
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert expected in err, err
    assert "unexpected" not in err, f"a known case must have its own sentence: {err}"


@pytest.mark.parametrize(("case", "expected"), [(c, e) for _, c, e in CASES], ids=[i for i, _, _ in CASES])
def test_bad_input_is_one_line_and_a_non_zero_exit(
    case: Case, expected: str, bad: BadInputs, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(case(bad))
    except SystemExit as exited:  # argparse's own checks end the process with exit code 2
        code = int(exited.code or 0)
    assert_one_line_error(code, capsys.readouterr().err, expected)


@pytest.mark.parametrize("command", [["stop"], ["pull"], ["logs", "--payload"]])
def test_an_unreachable_machine_is_one_line_and_exit_1(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    run_id = unreachable_run()
    code = main([command[0], run_id, *command[1:]])
    err = capsys.readouterr().err
    assert_one_line_error(code, err, "refuses SSH connections")
    assert code == 1 and run_id in err and "check that the machine is running" in err
    if command == ["stop"]:
        assert RunStore().get(run_id).state is RunState.TRAINING, "a stop that could not reach the trainer says so"


def rentune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "desktop", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=os.environ | {"PYTHONWARNINGS": "error"},
    )


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (lambda b: ["run", str(b.folder)], "is a folder"),
        (lambda b: ["run", str(b.spec("s.toml", '[budget]\nmax_usd = "ten"'))], "[budget] max_usd"),
        (lambda b: ["data", "check", str(b.latin1_data)], "no row is usable"),
        (lambda b: ["data", "prepare", str(b.good_data), "--out", str(b.a_file)], "is a file"),
    ],
    ids=["spec-folder", "max-usd-ten", "data-not-utf8", "prepare-out-file"],
)
def test_as_a_real_process(case: Case, expected: str, bad: BadInputs) -> None:
    result = rentune(*case(bad))
    assert_one_line_error(result.returncode, result.stderr, expected)


def test_stop_of_an_unreachable_machine_as_a_real_process() -> None:
    result = rentune("stop", unreachable_run())
    assert result.returncode == 1
    assert_one_line_error(result.returncode, result.stderr, "refuses SSH connections")


def test_an_unforeseen_error_is_one_line_with_the_log_path(
    bad: BadInputs, rentune_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("desktop.cli.data.check_dataset", broken)
    assert main(["data", "check", str(bad.good_data)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: disk on fire" in err and "please report it" in err
    log = next(rentune_home.rglob("rentune.log")).read_text()
    assert "Traceback" in log and "disk on fire" in log, "the details are in the log for a bug report"
