"""RunProgress follows the payload's events; phase durations and cost come from the recorded transitions."""

from __future__ import annotations

from typing import Any

import pytest

from desktop.core.runs.progress import (
    RunProgress,
    billable_seconds,
    cost_so_far,
    format_duration,
    phase_durations,
    run_duration,
)
from desktop.core.runs.states import RunState


def step(seq: int, ts: float, number: int, loss: float, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "seq": seq, "event": "step", "step": number, "total_steps": 100, "loss": loss, **extra}


def transitions(*rows: tuple[float, str]) -> list[dict[str, Any]]:
    return [{"ts": ts, "to_state": state, "from_state": None, "note": ""} for ts, state in rows]


def test_steps_build_the_loss_curve_and_the_latest_readings() -> None:
    progress = RunProgress()
    progress.apply(
        step(1, 10.0, 5, 2.5, lr=1e-4, tokens_per_s=900.0, tokens=5000.0, epoch=0.1, gpu_mem_allocated_gb=7.5)
    )
    progress.apply(
        step(2, 12.0, 10, 2.0, lr=2e-4, tokens_per_s=None, tokens=9000.0, epoch=0.2, gpu_mem_reserved_gb=9.0)
    )
    assert (progress.loss_steps, progress.losses) == ([5, 10], [2.5, 2.0])
    assert (progress.step, progress.total_steps, progress.epoch) == (10, 100, 0.2)
    assert progress.learning_rate == 2e-4
    assert progress.tokens_per_s == 900.0, "a step without a rate keeps the last known rate"
    assert progress.tokens == 9000.0
    assert (progress.gpu_mem_allocated_gb, progress.gpu_mem_reserved_gb) == (7.5, 9.0)


def test_gpu_readings_use_the_payloads_field_names() -> None:
    progress = RunProgress()
    progress.apply(step(1, 1.0, 1, 1.0, gpu_mem_allocated_gb=3.25, gpu_mem_reserved_gb=4.0, gpu_util=87))
    assert (progress.gpu_mem_allocated_gb, progress.gpu_mem_reserved_gb, progress.gpu_util) == (3.25, 4.0, 87.0)
    progress.apply(step(2, 2.0, 2, 1.0, gpu_util=None))
    assert progress.gpu_util is None, "a driver that stops answering shows no utilisation, not a stale one"


def test_eta_comes_from_the_recent_step_rate() -> None:
    progress = RunProgress()
    assert progress.eta_seconds is None
    for index in range(5):  # 10 steps every 4 s: 2.5 steps/s
        progress.apply(step(index + 1, 100.0 + 4 * index, 10 * (index + 1), 1.0))
    assert progress.steps_per_second == pytest.approx(2.5)
    assert progress.eta_seconds == pytest.approx((100 - 50) / 2.5)


def test_eta_follows_a_change_of_pace_within_the_window() -> None:
    progress = RunProgress()
    for index in range(40):  # slow at first (1 step/s), then 4 steps/s for the last 20 events
        ts = index * 1.0 if index < 20 else 19.0 + (index - 19) * 0.25
        progress.apply(step(index + 1, ts, index + 1, 1.0))
    assert progress.steps_per_second == pytest.approx(4.0)


def test_repeated_or_older_events_are_ignored() -> None:
    progress = RunProgress()
    assert progress.apply(step(1, 1.0, 1, 3.0))
    assert progress.apply(step(2, 2.0, 2, 2.0))
    assert not progress.apply(step(2, 2.0, 2, 2.0))
    assert not progress.apply(step(1, 1.0, 1, 3.0))
    assert progress.losses == [3.0, 2.0]
    assert progress.last_seq == 2


def test_evals_checkpoints_errors_and_done() -> None:
    progress = RunProgress()
    changed = progress.apply_all(
        [
            {"ts": 1, "seq": 1, "event": "state", "state": "training"},
            {"ts": 2, "seq": 2, "event": "eval", "step": 20, "eval_loss": 1.7},
            {
                "ts": 3,
                "seq": 3,
                "event": "checkpoint",
                "step": 20,
                "path": "checkpoints/checkpoint-20",
                "bytes": 4_000_000,
                "sha256": {"adapter_model.safetensors": "ab" * 32},
            },
            {"ts": 4, "seq": 4, "event": "error", "kind": "oom", "message": "CUDA out of memory", "hint": "lower it"},
            {
                "ts": 5,
                "seq": 5,
                "event": "done",
                "adapter_path": "adapter",
                "metrics": {"final_loss": 0.9},
                "wall_seconds": 50.5,
                "train_seconds": 40.25,
            },
        ]
    )
    assert changed
    assert progress.job_state == "training"
    assert (progress.eval_steps, progress.eval_losses) == ([20], [1.7])
    assert [(c.step, c.path, c.bytes) for c in progress.checkpoints] == [(20, "checkpoints/checkpoint-20", 4_000_000)]
    assert [(e.kind, e.message, e.hint) for e in progress.errors] == [("oom", "CUDA out of memory", "lower it")]
    assert progress.done is not None
    assert (progress.done.adapter_path, progress.done.train_seconds) == ("adapter", 40.25)
    assert progress.done.metrics == {"final_loss": 0.9}
    assert progress.eta_seconds is None, "a finished run has nothing left"


def test_phase_durations_end_each_phase_at_the_next_transition() -> None:
    history = transitions((100, "planned"), (101, "connecting"), (104, "uploading"), (110, "training"))
    spans = phase_durations(history, now=170)
    assert [(s.state, s.seconds, s.current) for s in spans] == [
        (RunState.PLANNED, 1, False),
        (RunState.CONNECTING, 3, False),
        (RunState.UPLOADING, 6, False),
        (RunState.TRAINING, 60, True),
    ]


def test_a_finished_run_has_no_open_phase() -> None:
    history = transitions((0, "planned"), (1, "connecting"), (2, "training"), (50, "pulling"), (60, "finished"))
    spans = phase_durations(history, now=10_000)
    assert spans[-1].state is RunState.FINISHED and spans[-1].seconds == 0
    assert run_duration(history, now=10_000) == 60


def test_billing_runs_from_connecting_until_paused_and_again_after_resuming() -> None:
    history = transitions(
        (0, "planned"),
        (10, "connecting"),  # bill starts
        (20, "training"),
        (110, "paused"),  # machine lost: 100 s billed
        (500, "connecting"),  # resumed on a machine: bill starts again
        (520, "training"),
    )
    assert billable_seconds(history, now=600) == 100 + 100
    assert cost_so_far(3.6, history, now=600) == pytest.approx(3.6 * 200 / 3600)


def test_billing_ends_at_finished_failed_or_cancelled() -> None:
    for end in ("finished", "failed", "cancelled"):
        history = transitions((0, "planned"), (5, "provisioning"), (6, "connecting"), (65, end))
        assert billable_seconds(history, now=10_000) == 60, end


def test_no_rate_costs_nothing() -> None:
    history = transitions((0, "planned"), (1, "connecting"))
    assert cost_so_far(0.0, history, now=3600) == 0.0
    assert cost_so_far(None, history, now=3600) == 0.0
    assert cost_so_far(2.0, transitions((0, "planned")), now=3600) == 0.0, "a run that never connected bills nothing"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "—"), (0, "0 s"), (42.4, "42 s"), (185, "3 min 05 s"), (3600 * 2 + 7 * 60 + 20, "2 h 07 min")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_a_malformed_event_is_skipped() -> None:
    progress = RunProgress()
    assert not progress.apply({"seq": "x", "event": "step"})
    assert not progress.apply({"seq": 1, "ts": 1.0, "event": "step", "step": "three", "loss": 1.0})
    assert progress.apply(step(2, 2.0, 3, 1.5))
    assert (progress.step, progress.losses) == (3, [1.5])
