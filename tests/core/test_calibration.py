"""Speeds measured on finished runs correct later estimates for the same GPU type."""

from __future__ import annotations

import pytest

from desktop.core.sizing.calibration import SpeedSample, calibrate, calibrated, calibration_note
from desktop.core.sizing.gpus import GpuSpec

GPU = GpuSpec("rtx4090", "RTX 4090", 24, 165, "pcie", 0.69, 0.44)
OTHER = GpuSpec("a10", "A10", 22.5, 125, "pcie", 0.75, 0.33)


def test_the_median_ratio_per_gpu_type_scales_its_utilisation() -> None:
    samples = [SpeedSample("rtx4090", 1000, 500), SpeedSample("rtx4090", 1000, 600), SpeedSample("rtx4090", 1000, 900)]
    calibrations = calibrate(samples)
    assert calibrations["rtx4090"].ratio == 0.6 and calibrations["rtx4090"].runs == 3
    fixed, other = calibrated([GPU, OTHER], calibrations)
    assert abs(fixed.mfu - 0.44 * 0.6) < 1e-9 and other == OTHER, "only the measured type changes"


def test_implausible_or_empty_measurements_are_ignored() -> None:
    samples = [SpeedSample("rtx4090", 1000, 1), SpeedSample("rtx4090", 0, 500), SpeedSample("a10", 1000, 0)]
    assert calibrate(samples) == {}
    assert calibration_note({}, [GPU]) is None


def test_the_note_names_the_gpu_the_runs_and_the_ratio() -> None:
    note = calibration_note(calibrate([SpeedSample("rtx4090", 1000, 800)]), [GPU])
    assert note == "speeds measured on your runs: RTX 4090 from 1 run (0.80x the estimate)"


def test_runs_of_the_same_kind_of_job_decide_a_gpu_types_speed_when_there_are_any() -> None:
    from desktop.core.sizing.calibration import JobKind

    mine, other = JobKind("Qwen2.5-7B", 7.62, "qlora", 2048), JobKind("Qwen2.5-7B", 7.62, "qlora", 512)
    samples = [SpeedSample("rtx4090", 1000, 500, "a", mine), SpeedSample("rtx4090", 1000, 900, "b", other)]
    assert calibrate(samples, mine)["rtx4090"].run_ids == ("a",), "the same job's run only"
    assert calibrate(samples)["rtx4090"].runs == 2, "without a kind: every run on the type"
    lonely = JobKind("Llama-3.1-8B", 8.03, "lora", 2048)
    assert calibrate(samples, lonely)["rtx4090"].runs == 2, "no run of this job: every run on the type"
    assert JobKind.from_dict(mine.as_dict()) == mine and JobKind.from_dict({"model": "x"}) is None


def test_measured_peaks_correct_the_memory_model_for_their_job_and_gpu_type_only() -> None:
    from desktop.core.sizing.calibration import JobKind, MemorySample, memory_corrections, memory_note
    from desktop.core.sizing.memory import MemoryEstimate
    from desktop.core.sizing.plan import corrected_memory

    job, other = JobKind("Qwen2.5-7B", 7.62, "qlora", 2048), JobKind("Qwen2.5-7B", 7.62, "lora", 2048)
    samples = [
        MemorySample(job, "rtx4090", 10.0, 12.0, "r1"),
        MemorySample(job, "rtx4090", 10.0, 14.0, "r2"),
        MemorySample(job, "rtx4090", 10.0, 90.0, "r3"),  # 9x: another job on the card, not this one
        MemorySample(other, "a10", 10.0, 11.0, "r4"),
    ]
    corrections = memory_corrections(samples, job)
    assert list(corrections) == ["rtx4090"] and corrections["rtx4090"].ratio == 1.3
    assert corrections["rtx4090"].run_ids == ("r1", "r2")
    assert memory_note(corrections, [GPU]) == (
        "peak memory measured on your runs of this job: RTX 4090 from 2 runs (the newest r2) (1.30x the memory model)"
    )
    model = MemoryEstimate({"weights": 9.6, "cuda_context": 0.4}, 10.0)
    fixed = corrected_memory(model, corrections["rtx4090"])
    assert fixed.items["measured"] == 2.88 and fixed.per_gpu_total == 12.88, "the CUDA context is not scaled"
    assert sum(fixed.items.values()) == pytest.approx(fixed.per_gpu_total)
