"""A trial on this computer's CPU with the payload, for real: the tiny model learns on a slice, answers, is listed."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import psutil
import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.core.runs.trial import Machine, TrialBackend, TrialPlan
from desktop.services.runs.adapters import read_inventory
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.spec_file import read_run_spec
from desktop.services.runs.store import RunStore
from desktop.services.trial import runner
from desktop.services.trial.data import write_trial_data
from desktop.services.trial.errors import TrialError
from desktop.services.trial.planning import plan_for_spec, trial_job
from desktop.services.trial.runner import TrialWatch, run_trial, trials_root
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import TinyModel
from trainer_payload.protocol import EventKind

LAPTOP = Machine(apple_silicon=False, cuda_gb=0, memory_gb=16, cpu_count=2)


def write_spec(folder: Path, base: str, *, rows: int = 400, eval_rows: int = 8) -> Path:
    """A rented run's SPEC.toml (QLoRA on a RunPod GPU) over the tiny model and a chat dataset."""
    folder.mkdir(parents=True, exist_ok=True)
    write_chat_dataset(folder / "train.jsonl", count=rows)
    evaluation = ""
    if eval_rows:
        write_chat_dataset(folder / "eval.jsonl", count=eval_rows, seed=5)
        evaluation = 'eval = "eval.jsonl"'
    (folder / "SPEC.toml").write_text(
        f'[model]\nbase = "{base}"\n[data]\ntrain = "train.jsonl"\n{evaluation}\n'
        '[training]\nmethod = "qlora"\nlora_r = 8\nseq_len = 2048\nlearning_rate = 0.003\n'
        '[compute]\nprovider = "runpod"\ngpu = "RTX 4090"\n',
        encoding="utf-8",
    )
    return folder / "SPEC.toml"


def test_the_trial_job_keeps_the_runs_labels_and_makes_the_rest_small(tmp_path: Path, tiny_model: TinyModel) -> None:
    spec = read_run_spec(write_spec(tmp_path, str(tiny_model.path)))
    plan = plan_for_spec(spec, LAPTOP, 400, steps=30)
    assert plan.backend is TrialBackend.CPU and plan.rows == 16 and plan.steps == 30
    job = trial_job(spec, plan)
    assert job["method"] == "lora", "QLoRA's 4-bit kernels need CUDA: the same adapter trains as LoRA"
    assert (job["seq_len"], job["micro_batch"], job["grad_accum"], job["max_steps"]) == (512, 1, 1, 30)
    assert job["lora_r"] == 8 and job["learning_rate"] == 0.003 and job["eval_file"] is None
    assert job["checkpoint_steps"] == 0 and job["checkpoint_minutes"] == 0
    spec_7b = read_run_spec(write_spec(tmp_path / "big", "qwen2.5-7b"))
    too_big = plan_for_spec(spec_7b, LAPTOP, 400)
    assert not too_big.possible and too_big.reason.startswith("too big to try here")


def test_the_slice_takes_the_first_chats_and_asks_chats_it_did_not_train_on(tmp_path: Path) -> None:
    spec = read_run_spec(write_spec(tmp_path / "with-eval", "m"))
    data = write_trial_data(spec, 16, tmp_path / "slice")
    train = (tmp_path / "slice" / "train.jsonl").read_text().splitlines()
    assert data.rows == 16 and train == (tmp_path / "with-eval" / "train.jsonl").read_text().splitlines()[:16]
    evaluation = [json.loads(line) for line in (tmp_path / "with-eval" / "eval.jsonl").read_text().splitlines()]
    assert [h.expected for h in data.held_out] == [row["messages"][-1]["content"] for row in evaluation[:3]]
    no_eval = read_run_spec(write_spec(tmp_path / "no-eval", "m", rows=20, eval_rows=0))
    data = write_trial_data(no_eval, 16, tmp_path / "slice2")
    rows = [json.loads(line) for line in (tmp_path / "no-eval" / "train.jsonl").read_text().splitlines()]
    assert [h.expected for h in data.held_out] == [row["messages"][-1]["content"] for row in rows[16:19]]
    (tmp_path / "no-eval" / "train.jsonl").write_text("not json\n")
    with pytest.raises(TrialError, match="holds no chat"):
        write_trial_data(no_eval, 16, tmp_path / "slice3")


@pytest.mark.slow
def test_rentune_trial_trains_the_slice_on_the_cpu_answers_and_lists_the_adapter(
    tmp_path: Path, tiny_model: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, str(tiny_model.path))
    assert main(["trial", str(spec), "--steps", "40", "--on", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plan"] == {"backend": "cpu", "rows": 16, "steps": 40}
    assert result["loss_falls"] and result["loss_end"] < result["loss_start"] - 0.2, result["losses"]
    assert result["tokens_per_s"] > 0 and 0 < result["peak_memory_gb"] < 16
    assert len(result["answers"]) == 3 and all(a["answer"] for a in result["answers"])
    record = RunStore().get(result["run_id"])
    assert record.state is RunState.FINISHED and record.spec["trial"]["backend"] == "cpu"
    assert record.spec["trial"]["achieved_tflops"] > 0 and record.spec["trial"]["memory_gb"] > 0
    assert main(["costs", "--rent-or-buy", "--card", "this-computer", "--hours", "10", "--json"]) == 0
    weighed = json.loads(capsys.readouterr().out)
    assert weighed["owned"]["card"] == "this-computer" and weighed["owned"]["price_usd"] == 0
    assert record.adapter == result["adapter"] and (Path(result["adapter"]) / "adapter_config.json").is_file()
    steps = [e for e in mirrored_events(RunStore().folder(record.id)) if e["event"] is EventKind.STEP]
    assert [e["step"] for e in steps] == list(range(1, 41)), "the monitor draws the trial's loss"
    listed = read_inventory(RunStore()).adapters
    assert [a.run_id for a in listed] == [record.id] and listed[0].trained_seconds > 0 and listed[0].usd is None
    assert main(["trial", str(spec), "--steps", "3", "--on", "cpu"]) == 1, "three steps prove nothing"
    out, err = capsys.readouterr()
    assert "step 3/3  loss" in out and "the loss did not fall on the slice" in err


@pytest.mark.slow
def test_a_stopped_trial_stops_its_trainer_and_records_nothing(tmp_path: Path, tiny_model: TinyModel) -> None:
    spec = read_run_spec(write_spec(tmp_path, str(tiny_model.path)))
    plan = TrialPlan(TrialBackend.CPU, 16, 5000, "a long trial")

    async def stop_after_the_first_step() -> None:
        first = asyncio.Event()
        watch = TrialWatch(lambda _step: first.set())
        task = asyncio.create_task(run_trial(spec, plan, python=sys.executable, store=RunStore(), watch=watch))
        await asyncio.wait_for(first.wait(), 120)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(stop_after_the_first_step())
    assert RunStore().all() == []
    job = next(trials_root().glob("*/job.json"))
    running = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"]) if str(job) in (p.info["cmdline"] or [])]
    assert running == [], "the trainer ended with the trial"
    steps = [e for e in mirrored_events(job.parent / "out") if e["event"] is EventKind.STEP]
    assert 1 <= len(steps) < 5000, "stopped long before its last step"


def test_a_python_without_the_trainer_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(runner.NEEDED, TrialBackend.CPU, ("torch", "rentune_no_such_trainer"))
    with pytest.raises(TrialError, match="cannot import torch, rentune_no_such_trainer: a trial needs the payload"):
        asyncio.run(runner.check_python(sys.executable, TrialBackend.CPU))
    asyncio.run(runner.check_python(sys.executable, TrialBackend.MLX))  # this test environment has mlx-lm
