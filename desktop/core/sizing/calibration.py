"""Learning from runs: a GPU type's measured speed corrects later estimates for it.

A run stores the training speed sizing predicted and the speed its machine measured (its first minutes' calibration,
else the median of its steps once finished); their ratio, per GPU type (the median over runs), scales that GPU's
achievable utilisation (``mfu``) in later plans, and the plan names the runs it learnt from.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace

from desktop.core.sizing.gpus import GpuSpec

#: Ratios outside this band are treated as mismeasured (a run on another machine, a stalled trainer).
PLAUSIBLE_RATIO = (0.05, 20.0)


@dataclass(frozen=True)
class SpeedSample:
    """One run's predicted and measured training speed on one GPU type (and which run measured it)."""

    gpu_id: str
    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    run_id: str = ""


@dataclass(frozen=True)
class Calibration:
    """How fast a GPU type really trained, relative to the estimate.

    Attributes:
        gpu_id: The GPU type.
        ratio: Measured over predicted speed (median over runs).
        runs: Runs measured.
        run_ids: Those runs' ids, as the samples named them.
    """

    gpu_id: str
    ratio: float
    runs: int
    run_ids: tuple[str, ...] = ()


def calibrate(samples: Iterable[SpeedSample]) -> dict[str, Calibration]:
    """Per GPU type, the median measured/predicted speed ratio of plausible samples."""
    ratios: dict[str, list[float]] = {}
    runs: dict[str, list[str]] = {}
    for sample in samples:
        if sample.predicted_tokens_per_s <= 0 or sample.measured_tokens_per_s <= 0:
            continue
        ratio = sample.measured_tokens_per_s / sample.predicted_tokens_per_s
        if PLAUSIBLE_RATIO[0] <= ratio <= PLAUSIBLE_RATIO[1]:
            ratios.setdefault(sample.gpu_id, []).append(ratio)
            runs.setdefault(sample.gpu_id, []).extend([sample.run_id] if sample.run_id else [])
    return {
        gpu: Calibration(gpu, statistics.median(values), len(values), tuple(runs.get(gpu, ())))
        for gpu, values in ratios.items()
    }


def calibrated(gpus: Iterable[GpuSpec], calibrations: dict[str, Calibration]) -> list[GpuSpec]:
    """The GPU types with measured speed applied (their ``mfu`` scaled by the measured ratio)."""
    return [replace(gpu, mfu=gpu.mfu * calibrations[gpu.id].ratio) if gpu.id in calibrations else gpu for gpu in gpus]


def calibration_note(calibrations: dict[str, Calibration], gpus: Iterable[GpuSpec]) -> str | None:
    """Says which GPU types' speeds come from the user's runs ("RTX 4090 from 2 runs"), or None."""
    names = {gpu.id: gpu.name for gpu in gpus}
    parts = [
        f"{names.get(c.gpu_id, c.gpu_id)} from {_runs_words(c)} ({c.ratio:.2f}x the estimate)"
        for c in sorted(calibrations.values(), key=lambda c: c.gpu_id)
    ]
    return "speeds measured on your runs: " + "; ".join(parts) if parts else None


def _runs_words(calibration: Calibration) -> str:
    """``run 20261205-…`` for one, ``3 runs (the newest 20261205-…)`` for more."""
    newest = max(calibration.run_ids) if calibration.run_ids else ""
    if calibration.runs == 1:
        return f"run {newest}" if newest else "1 run"
    return f"{calibration.runs} runs" + (f" (the newest {newest})" if newest else "")
