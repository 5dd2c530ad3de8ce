"""Speeds measured on finished runs correct later estimates for the same GPU type."""

from __future__ import annotations

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
