"""The payload trains the tiny model for real on the CPU: events, checkpoints, resume, signals, failures."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import TinyModel
from tests.payload.conftest import JobFactory, events_of, losses, run_payload, start_payload
from trainer_payload.checkpoints import is_complete
from trainer_payload.protocol import EventKind, JobState

pytestmark = pytest.mark.slow


def wait_for_event(job: Path, predicate, timeout: float = 120) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in events_of(job):
            if predicate(event):
                return event
        time.sleep(0.02)
    raise AssertionError("the event never came")


def test_forty_steps_report_learn_checkpoint_and_leave_a_working_adapter(
    make_job: JobFactory, tiny_model: TinyModel
) -> None:
    job = make_job(eval_file="eval.jsonl")  # rows held out, no interval set: evaluated about ten times
    write_chat_dataset(job.parent / "eval.jsonl", count=8)
    result = run_payload(job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = events_of(job)
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == list(range(4, 41, 4)) and all(e["eval_loss"] > 0 for e in evals)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(e["event"] in set(EventKind) for e in events)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    states = [e["state"] for e in events if e["event"] == "state"]
    assert states == ["preparing", "training", "saving", "done"]
    by_step = losses(events)
    assert sorted(by_step) == list(range(1, 41))
    first, last = [by_step[s] for s in range(1, 6)], [by_step[s] for s in range(36, 41)]
    assert sum(last) / 5 < sum(first) / 5 - 0.3, "the loss must visibly go down"
    assert all(e["tokens_per_s"] > 0 for e in events if e["event"] == "step" and e["step"] > 1)
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [10, 20, 30, 40]
    done = next(e for e in events if e["event"] == "done")
    adapter = job.parent / "out" / done["adapter_path"]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    assert is_complete(adapter)
    assert (job.parent / "out" / "STOP_MACHINE").exists(), "the watchdog marker tells the machine can stop"
    assert_adapter_changes_the_model(tiny_model.path, adapter)


def assert_adapter_changes_the_model(base: Path, adapter: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    inputs = tokenizer("What is two plus three?", return_tensors="pt")
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(base)(**inputs).logits
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)(**inputs).logits
    assert not torch.allclose(plain, tuned, atol=1e-3)


def test_kill_9_then_restart_resumes_exactly_and_skips_a_truncated_checkpoint(
    make_job: JobFactory, tmp_path: Path
) -> None:
    reference = make_job("reference", max_steps=50)
    assert run_payload(reference).returncode == 0
    expected = losses(events_of(reference))

    job = make_job("broken", max_steps=50)
    process = start_payload(job, tmp_path / "payload.log")
    wait_for_event(job, lambda e: e["event"] == "checkpoint" and e["step"] == 30)
    process.kill()
    process.wait()
    out = job.parent / "out" / "checkpoints"
    newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    (newest / "adapter_model.safetensors").write_bytes(b"torn")  # as if the kill hit mid-write
    resumed_from = int(newest.name.split("-")[1]) - 10

    result = run_payload(job)
    assert result.returncode == 0, result.stdout[-3000:]
    events = events_of(job)
    training = [e for e in events if e["event"] == "state" and e["state"] == "training"]
    assert training[-1]["resume_from"] == f"checkpoint-{resumed_from}"
    after = [e for e in events[events.index(training[-1]) :] if e["event"] == "step"]
    assert after[0]["step"] == resumed_from + 1
    for event in after:
        assert event["loss"] == pytest.approx(expected[event["step"]], abs=1e-5)


def test_sigterm_saves_a_checkpoint_and_says_why(make_job: JobFactory, tmp_path: Path) -> None:
    job = make_job(max_steps=100_000, checkpoint_steps=0)
    process = start_payload(job, tmp_path / "payload.log")
    wait_for_event(job, lambda e: e["event"] == "step" and e["step"] >= 5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143
    events = events_of(job)
    checkpoint = next(e for e in events if e["event"] == "checkpoint")
    assert is_complete(job.parent / "out" / checkpoint["path"])
    final = events[-1]
    assert final["event"] == "state" and final["state"] == JobState.FAILED
    assert (
        final["stopped_by"] == "signal"
        and "SIGTERM" in final["reason"]
        and f"step {checkpoint['step']}" in final["reason"]
    )
    assert final["checkpoint_step"] == checkpoint["step"], "the saved step is a field, never read from the words"


@pytest.mark.parametrize(("method", "folder"), [("qlora", "adapter"), ("full", "model"), ("full-8bit", "model")])
def test_qlora_and_full_finetune_paths_run_on_cpu(make_job: JobFactory, method: str, folder: str) -> None:
    unsloth = method == "qlora"  # one case also asks for unsloth, which is not here: trl trains and says why
    job = make_job(method=method, max_steps=6, checkpoint_steps=3, **({"engine": "unsloth"} if unsloth else {}))
    result = run_payload(job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    done = next(e for e in events_of(job) if e["event"] == "done")
    assert done["adapter_path"] == folder
    assert done["metrics"]["steps"] == 6
    if unsloth:
        preparing = next(e for e in events_of(job) if e["event"] == "state" and e["state"] == "preparing")
        assert preparing["engine"].startswith("trl (unsloth was requested, but unsloth")
        assert "instead" in preparing["engine"]


def test_bad_job_spec_is_a_config_error(make_job: JobFactory) -> None:
    job = make_job(method="dora")
    result = run_payload(job)
    assert result.returncode == 2
    error = next(e for e in events_of(job) if e["event"] == "error")
    assert error["kind"] == "config" and "method 'dora'" in error["message"] and error["hint"]


def test_bad_dataset_row_is_a_data_error_with_its_line(make_job: JobFactory) -> None:
    job = make_job()
    rows = (job.parent / "train.jsonl").read_text().splitlines()
    rows[6] = json.dumps({"messages": [{"role": "user", "content": "no answer"}]})
    (job.parent / "train.jsonl").write_text("\n".join(rows) + "\n")
    result = run_payload(job)
    assert result.returncode == 1
    error = next(e for e in events_of(job) if e["event"] == "error")
    assert error["kind"] == "data" and "train.jsonl:7" in error["message"]
    assert "rentune data check" in error["hint"]
    assert events_of(job)[-1]["state"] == "failed"


def test_two_processes_under_accelerate_launch_train_one_adapter(make_job: JobFactory) -> None:
    """num_gpus=2 goes through `accelerate launch` (DDP); on this CPU box the two ranks talk over gloo."""
    job = make_job(num_gpus=2, strategy="ddp", max_steps=4, checkpoint_steps=2)
    result = run_payload(job, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = events_of(job)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "only rank 0 reports"
    assert [e["state"] for e in events if e["event"] == "state"] == ["preparing", "training", "saving", "done"]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2, 4]
    assert next(e for e in events if e["event"] == "done")["metrics"]["steps"] == 4


def test_sigterm_reaches_every_rank_of_a_distributed_run(make_job: JobFactory, tmp_path: Path) -> None:
    """Spot preemption of a multi-GPU job: the launcher forwards SIGTERM, rank 0 seals a checkpoint and says why."""
    job = make_job(num_gpus=2, max_steps=400, checkpoint_steps=0)
    process = start_payload(job, tmp_path / "payload.log")
    wait_for_event(job, lambda e: e["event"] == "step" and e["step"] >= 3)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    events = events_of(job)
    checkpoint = next(e for e in events if e["event"] == "checkpoint")
    assert is_complete(job.parent / "out" / checkpoint["path"])
    assert events[-1]["event"] == "state" and events[-1]["stopped_by"] == "signal"


def test_fsdp_without_gpus_is_a_config_error_with_a_hint(make_job: JobFactory) -> None:
    job = make_job(num_gpus=2, strategy="fsdp")
    assert run_payload(job).returncode == 2
    error = next(e for e in events_of(job) if e["event"] == "error")
    assert error["kind"] == "config" and "needs NVIDIA GPUs" in error["message"]


def test_the_launcher_gives_the_ranks_time_to_save_before_it_kills_them(
    make_job: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's launcher SIGKILLs the ranks 30 s after forwarding SIGTERM unless told otherwise: on a loaded machine
    that came before the step and the save ended, and the stop's checkpoint was lost."""
    from trainer_payload import train
    from trainer_payload.protocol import JobSpec

    started: list[dict[str, str]] = []

    class Launcher:
        pid = 0

        def __init__(self, command: list[str], *, start_new_session: bool, env: dict[str, str]) -> None:
            assert start_new_session and "accelerate.commands.launch" in command
            started.append(env)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(train.subprocess, "Popen", Launcher)
    monkeypatch.setattr(train.signal, "signal", lambda *_args: None)  # this test process keeps its own handlers
    job = make_job(num_gpus=2, strategy="ddp")
    assert train._launch_distributed(JobSpec.load(job), job) == 0
    assert started[0]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(train.STOP_GRACE_SECONDS)
    assert train.STOP_GRACE_SECONDS >= 300
