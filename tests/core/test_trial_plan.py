"""Where a trial runs and what it proved (pure): the backend for each computer, the slice, the loss verdict."""

from __future__ import annotations

import pytest

from desktop.core.runs.trial import (
    MAX_TRIAL_MINUTES,
    Machine,
    TrialBackend,
    TrialResult,
    TrialStep,
    plan_trial,
    slice_rows,
)

MAC = Machine(apple_silicon=True, cuda_gb=0, memory_gb=32, cpu_count=10)
CUDA = Machine(apple_silicon=False, cuda_gb=24, memory_gb=64, cpu_count=16)
LAPTOP = Machine(apple_silicon=False, cuda_gb=0, memory_gb=16, cpu_count=8)


def test_each_computer_trains_with_what_it_has() -> None:
    small = {"params_b": 0.5, "train_gb": 3.0, "total_rows": 10_000, "cpu_minutes": 4.0}
    assert plan_trial(MAC, **small).backend is TrialBackend.MLX
    assert plan_trial(CUDA, **small).backend is TrialBackend.GPU
    plan = plan_trial(LAPTOP, **small)
    assert plan.backend is TrialBackend.CPU and plan.rows == 100 and plan.steps == 50
    assert plan.reason == "50 steps on 100 rows with this computer's CPU"
    assert plan_trial(CUDA, **small, backend=TrialBackend.CPU).backend is TrialBackend.CPU, "the user's choice"


def test_a_model_too_big_for_this_computer_says_so_and_why() -> None:
    slow = plan_trial(LAPTOP, params_b=7.6, train_gb=9.0, total_rows=1000, cpu_minutes=MAX_TRIAL_MINUTES + 1)
    assert not slow.possible and slow.reason.startswith("too big to try here: 7.6 B parameters would train about")
    big = plan_trial(CUDA, params_b=70, train_gb=150, total_rows=1000, cpu_minutes=1e6)
    assert not big.possible and "needs about 150.0 GB and this computer's NVIDIA GPU has 21.6 GB" in big.reason
    assert plan_trial(CUDA, params_b=7, train_gb=20, total_rows=1000, cpu_minutes=1e6).possible, "GPUs are not timed"


def test_the_slice_is_one_percent_but_never_a_handful() -> None:
    assert slice_rows(10_000) == 100
    assert slice_rows(50) == 16 and slice_rows(10) == 10
    assert slice_rows(10_000, 0.05) == 500


def _result(losses: list[float], speeds: list[float | None] | None = None) -> TrialResult:
    speeds = speeds or [None] * len(losses)
    steps = tuple(TrialStep(i + 1, loss, speed) for i, (loss, speed) in enumerate(zip(losses, speeds, strict=True)))
    return TrialResult(TrialBackend.CPU, steps, 10.0, 1.0)


def test_the_loss_falls_when_the_last_fifth_is_clearly_under_the_first() -> None:
    falling = _result([3.0, 2.9, 2.8, 2.6, 2.5, 2.4, 2.3, 2.2, 2.1, 2.0])
    assert falling.loss_start == pytest.approx(2.95) and falling.loss_end == pytest.approx(2.05)
    assert falling.loss_falls
    assert not _result([3.0, 3.0, 2.9, 3.0, 3.05, 2.99, 3.0, 3.02, 2.98, 2.99]).loss_falls, "1 % is noise"
    assert not _result([3.0, float("nan"), float("nan")]).loss_falls
    assert not _result([3.0]).loss_falls, "one step proves nothing"


def test_the_speed_is_the_median_after_the_warm_up_step() -> None:
    result = _result([3.0, 2.0, 1.0, 0.5], [10.0, 1000.0, 1200.0, 1100.0])
    assert result.tokens_per_s == 1100.0
    assert result.as_dict()["losses"] == [3.0, 2.0, 1.0, 0.5] and result.as_dict()["backend"] == "cpu"
