"""Estimate, measure, correct: a run's prediction beside its measurement, and later plans learning from it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.models.configs import load_gpus
from desktop.services.runs.estimates import load_calibrations, measure, paid_idle, predict
from desktop.services.runs.store import RunStore
from tests.fixtures.tiny_models import TinyModel

FLOW = ["connecting", "uploading", "bootstrapping", "training", "syncing", "pulling", "finished"]


def _finished_run(store: RunStore, predicted: dict[str, object], speeds: list[float]) -> str:
    record = store.create({"base_model": "qwen2.5-7b", "predicted": predicted}, None)
    for state in FLOW:
        store.transition(record.id, RunState(state))
    now = time.time()
    lines = [
        {"v": 1, "seq": i + 1, "ts": now + i, "event": "step", "step": i + 1, "loss": 1.0, "tokens_per_s": speed}
        for i, speed in enumerate(speeds)
    ]
    (store.folder(record.id) / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return record.id


def test_prediction_for_a_gpu_and_price(tiny_model: TinyModel, chat_dataset: Path) -> None:
    spec = {"base_model": str(tiny_model.path), "train_file": str(chat_dataset), "training": {"method": "lora"}}
    predicted = predict(spec, "RTX 4090", 1, 0.44, load_gpus())
    assert predicted is not None and predicted["gpu"] == "rtx4090"
    assert predicted["tokens_per_s"] > 0 and predicted["hours"] > 0 and predicted["peak_gb"] > 0
    assert predicted["usd"] == round(predicted["hours"] * 0.44, 2)
    assert predict(spec, "Mystery GPU 9000", 1, 1.0, load_gpus()) is None, "an unknown GPU gets no estimate"


def test_measurement_and_paid_idle_from_events_and_the_ledger() -> None:
    store = RunStore()
    run_id = _finished_run(store, {}, [100.0, 300.0, 200.0])
    ledger = Ledger()
    started = time.time() - 10
    ledger.open(run_id, "runpod", "pod-1", "RTX 4090", 0.36, started=started)
    ledger.close("runpod", "pod-1", time.time() + 20)
    rentals = ledger.rentals(run_id)
    measured = measure(store.folder(run_id), rentals)
    assert measured["tokens_per_s"] == 200.0 and measured["steps"] == 3
    assert measured["usd"] == pytest.approx(0.36 * 30 / 3600, abs=1e-3)
    idle = paid_idle(store.get(run_id), store.transitions(run_id), rentals, store.folder(run_id))
    assert 9 <= (idle["create_to_first_step_s"] or 0) <= 11, "created 10 s before the first step"
    assert idle["adapter_to_terminate_s"] is not None and 19 <= idle["adapter_to_terminate_s"] <= 21


def test_later_plans_use_the_speed_measured_for_that_gpu_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "qwen2.5-7b", "--gpu", "RTX 4090", "--gpus", "1", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["calibration"] is None
    run_id = _finished_run(RunStore(), {"gpu": "rtx4090", "tokens_per_s": 1000.0}, [500.0, 500.0])
    assert load_calibrations()["rtx4090"].ratio == 0.5
    assert main(["plan", "--model", "qwen2.5-7b", "--gpu", "RTX 4090", "--gpus", "1", "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["calibration"] == f"speeds measured on your runs: RTX 4090 from run {run_id} (0.50x the estimate)"
    assert after["options"][0]["tokens_per_s"] == pytest.approx(before["options"][0]["tokens_per_s"] * 0.5, rel=0.01)
    assert main(["plan", "--model", "qwen2.5-7b", "--gpu", "RTX 4090", "--gpus", "1"]) == 0
    assert f"Speeds measured on your runs: RTX 4090 from run {run_id}" in capsys.readouterr().out


def test_a_runs_first_minutes_teach_the_next_plan_before_it_finishes() -> None:
    store = RunStore()
    record = store.create({"base_model": "qwen2.5-7b", "predicted": {"gpu": "rtx4090", "tokens_per_s": 1000.0}}, None)
    for state in FLOW[: FLOW.index(RunState.TRAINING) + 1]:
        store.transition(record.id, RunState(state))
    now = time.time()
    calibration = {
        "seq": 1,
        "ts": now,
        "event": "calibration",
        "step": 21,
        "steps": 20,
        "micro_batch": 2,
        "grad_accum": 4,
        "seq_len": 2048,
        "seconds_per_step": 1.5,
        "tokens_per_s": 1500.0,
    }
    (store.folder(record.id) / "events.jsonl").write_text(json.dumps(calibration) + "\n")
    learnt = load_calibrations()["rtx4090"]
    assert learnt.ratio == 1.5 and learnt.run_ids == (record.id,)  # still training: its calibration already counts


def _run_that_measured_memory(store: RunStore, seq_len: int, peak_gb: float) -> tuple[str, float]:
    """A rented run of qwen2.5-7b (the default method) on an RTX 4090 whose first minutes measured ``peak_gb``."""
    from desktop.services.runs.estimates import measured_memory

    training = {"seq_len": seq_len}
    predicted = predict({"base_model": "qwen2.5-7b", "training": training}, "RTX 4090", 1, 0.44, load_gpus())
    assert predicted is not None
    spec = {"base_model": "qwen2.5-7b", "training": training, "predicted": predicted}
    calibration = {"micro_batch": 1, "grad_accum": 16, "gradient_checkpointing": True, "peak_reserved_gb": peak_gb}
    memory = measured_memory(spec, calibration)
    assert memory is not None and memory["gpu"] == "rtx4090" and memory["peak_gb"] == peak_gb
    record = store.create({**spec, "measured": {"hours": 1.0, "usd": 0.44, "step": 20, "memory": memory}}, None)
    return record.id, peak_gb / memory["model_peak_gb"]


def test_a_second_plan_for_the_same_job_and_gpu_uses_the_measured_peak_and_names_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = ["plan", "--model", "qwen2.5-7b", "--gpu", "RTX 4090", "--gpus", "1", "--micro-batch", "1"]
    assert main([*command, "--grad-accum", "16", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)["options"][0]
    assert before["memory_measured_by"] == []
    store = RunStore()
    run_id, ratio = _run_that_measured_memory(store, seq_len=before_seq_len(), peak_gb=12.0)
    _run_that_measured_memory(store, seq_len=512, peak_gb=3.0)  # another kind of job: it teaches nothing here
    assert main([*command, "--grad-accum", "16", "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    option = after["options"][0]
    assert option["memory_measured_by"] == [run_id]
    assert option["per_gpu_gb"] == pytest.approx(0.4 + (before["per_gpu_gb"] - 0.4) * ratio, abs=0.02)
    assert f"peak memory measured on your runs of this job: RTX 4090 from run {run_id} ({ratio:.2f}x" in str(
        after["calibration"]
    )
    assert main([*command, "--grad-accum", "16"]) == 0
    text = capsys.readouterr().out
    assert f"(memory of RTX 4090 as measured on run {run_id}: " in text


def before_seq_len() -> int:
    """The sequence length ``rentune plan`` sizes when none is given (the payload's default)."""
    from desktop.core.sizing.setup import DEFAULT_SETUP

    return DEFAULT_SETUP.seq_len


def test_the_sizing_step_says_which_run_measured_the_peak_it_uses(tmp_path: Path) -> None:
    from desktop.core.runs.draft import RunDraft
    from desktop.services.models.sizing import size_run
    from desktop.services.runs.drafts import learned_from_runs

    run_id, _ratio = _run_that_measured_memory(RunStore(), seq_len=before_seq_len(), peak_gb=12.0)
    draft = RunDraft(base_model="qwen2.5-7b", training={"micro_batch": 1, "grad_accum": 16})
    sizing = size_run(draft, None, None, learned_from_runs)
    assert sizing.measured is not None and f"RTX 4090 from run {run_id}" in sizing.measured
    measured = [o for o in sizing.plan.options if o.memory_measured_by]
    assert {o.gpu.id for o in measured} == {"rtx4090"} and measured[0].memory_measured_by == (run_id,)
    assert all(not o.memory_measured_by for o in size_run(draft, None).plan.options), "nothing learnt without runs"


def test_each_runs_events_are_read_once_until_they_change(monkeypatch: pytest.MonkeyPatch) -> None:
    from desktop.services.runs import estimates

    store = RunStore()
    run_id = _finished_run(store, {"gpu": "rtx4090", "tokens_per_s": 1000.0}, [1800.0, 2000.0, 2200.0])
    reads: list[Path] = []
    original = estimates.mirrored_events
    monkeypatch.setattr(estimates, "mirrored_events", lambda folder: reads.append(folder) or original(folder))
    assert load_calibrations()["rtx4090"].ratio == 2.0
    first = len(reads)
    assert first > 0 and load_calibrations()["rtx4090"].ratio == 2.0
    assert len(reads) == first, "opening Costs again or planning again reads no unchanged events file"
    events = store.folder(run_id) / "events.jsonl"
    step = {"v": 1, "seq": 4, "ts": time.time() + 9, "event": "step", "step": 4, "loss": 1.0, "tokens_per_s": 3000.0}
    with events.open("a") as file:
        file.write(json.dumps(step) + "\n")
    assert load_calibrations()["rtx4090"].ratio == 2.1 and len(reads) > first, "a changed file is read again"
