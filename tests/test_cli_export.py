"""``rentune export`` on the tiny model: a run id or a folder in, the outputs asked for out, one line on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.cli.app import main
from desktop.services.runs.store import RunStore
from tests.fixtures.adapters import TrainedAdapter

_KEYS = {"merged", "gguf", "lora_gguf", "base_gguf", "modelfile", "mlx", "merge_check", "mlx_sample", "notes"}


def test_a_run_id_exports_with_the_runs_base(
    pattern_adapter: TrainedAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore()
    run = store.create({"base_model": str(pattern_adapter.base), "eval_file": None}, None)
    store.update(run.id, adapter=str(pattern_adapter.path))
    monkeypatch.chdir(tmp_path)

    assert main(["export", run.id, "--merge", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == _KEYS
    assert out["merged"] == str(tmp_path / f"{run.id}-export" / "merged")
    assert (Path(out["merged"]) / "model.safetensors").is_file()
    assert out["gguf"] is None and out["mlx"] is None and out["modelfile"] is None
    assert out["merge_check"]["max_difference"] <= out["merge_check"]["tolerance"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["export", "no-such-run", "--merge"], "'no-such-run' is neither an adapter folder nor a run"),
        (["export", "./missing/", "--merge"], "no such adapter folder"),
        (["export", "ADAPTER", "--base", "./nowhere/", "--merge"], "no such folder, and not a Hugging Face id"),
        (["export", "ADAPTER", "--gguf", "Q3_X"], "GGUF type 'Q3_X' is not one of Q4_K_M"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    arguments: list[str],
    message: str,
    pattern_adapter: TrainedAdapter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    arguments = [str(pattern_adapter.path) if a == "ADAPTER" else a for a in arguments]
    assert _exit_code(arguments) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert list(work.iterdir()) == []


def _exit_code(arguments: list[str]) -> int:
    """main's return value, or the code argparse exits with."""
    try:
        return main(arguments)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_a_run_without_an_adapter_says_to_wait_or_pull(capsys: pytest.CaptureFixture[str]) -> None:
    run = RunStore().create({"base_model": "x"}, None)
    assert main(["export", run.id, "--merge"]) == 2
    assert f"run {run.id} has no adapter home yet (it is planned)" in capsys.readouterr().err
