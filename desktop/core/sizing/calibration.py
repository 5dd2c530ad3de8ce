"""Learning from runs: measured speed and memory correct later estimates for the same kind of job.

A run stores what sizing predicted and what its machine measured (its first minutes' calibration, else the median of
its steps once finished). Speed: the measured/predicted ratio scales a GPU type's achievable utilisation (``mfu``) in
later plans; runs of the same kind of job (:class:`JobKind`: model, method, sequence length) on that GPU type are
used when there are any, else every run on it. Memory: the measured/predicted peak of the same kind of job on the
same GPU type corrects the plan's memory (:class:`MemoryCorrection`). Plans name the runs they learnt from.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace

from desktop.core.sizing.architecture import Architecture
from desktop.core.sizing.gpus import GpuSpec
from desktop.core.sizing.setup import TrainingSetup

#: Ratios outside this band are treated as mismeasured (a run on another machine, a stalled trainer).
PLAUSIBLE_RATIO = (0.05, 20.0)
#: Measured peaks further than this from the model are treated as mismeasured (another job on the card).
PLAUSIBLE_MEMORY_RATIO = (0.3, 3.0)


@dataclass(frozen=True)
class JobKind:
    """What makes two fine-tunes alike for learning: the model (architecture and size), the method, the sequence length.

    Attributes:
        model: The architecture's name (``Qwen2.5-7B``...).
        params_b: Its size in billions of parameters (two decimals).
        method: ``qlora``, ``lora``, ``full`` or ``full-8bit``.
        seq_len: The sequence length.
        objective: ``sft``, ``dpo``, ``orpo`` or ``cpt`` (a DPO step does more per token than an SFT step).
    """

    model: str
    params_b: float
    method: str
    seq_len: int
    objective: str = "sft"

    @classmethod
    def of(cls, arch: Architecture, setup: TrainingSetup) -> JobKind:
        """The kind of the job ``setup`` trains on ``arch``."""
        params_b = round(arch.total_params / 1e9, 2)
        return cls(arch.name, params_b, setup.method.value, setup.seq_len, setup.objective.value)

    def as_dict(self) -> dict[str, str | float | int]:
        """JSON fields, as a run's record stores them."""
        return {
            "model": self.model,
            "params_b": self.params_b,
            "method": self.method,
            "seq_len": self.seq_len,
            "objective": self.objective,
        }

    @classmethod
    def from_dict(cls, fields: object) -> JobKind | None:
        """The kind stored by :meth:`as_dict`; None when ``fields`` is not one (a run from an older version)."""
        if not isinstance(fields, dict):
            return None
        try:
            return cls(
                str(fields["model"]),
                float(fields["params_b"]),
                str(fields["method"]),
                int(fields["seq_len"]),
                str(fields.get("objective", "sft")),  # runs recorded before objectives were
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class SpeedSample:
    """One run's predicted and measured training speed on one GPU type (and which run measured it, of what kind)."""

    gpu_id: str
    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    run_id: str = ""
    kind: JobKind | None = None


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


def calibrate(samples: Iterable[SpeedSample], kind: JobKind | None = None) -> dict[str, Calibration]:
    """Per GPU type, the median measured/predicted speed ratio of plausible samples.

    With ``kind``, a GPU type with samples of that kind of job uses only those (the closest measurement).
    """
    samples = list(samples)
    if kind is not None:
        alike = {s.gpu_id for s in samples if s.kind == kind}
        samples = [s for s in samples if s.gpu_id not in alike or s.kind == kind]
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


@dataclass(frozen=True)
class MemorySample:
    """One run's predicted and measured peak GPU memory (decimal GB per GPU) for its kind of job on one GPU type.

    Attributes:
        kind: The job.
        gpu_id: The GPU type.
        predicted_gb: The memory model's peak for the setup measured, without the CUDA context.
        measured_gb: The peak the framework reserved.
        run_id: The run that measured it.
    """

    kind: JobKind
    gpu_id: str
    predicted_gb: float
    measured_gb: float
    run_id: str


@dataclass(frozen=True)
class MemoryCorrection:
    """How a job's measured peak memory on a GPU type compares with the memory model.

    Attributes:
        gpu_id: The GPU type ("*": every type, as after an out-of-memory that measured this job's need).
        ratio: Measured over predicted peak (median over runs).
        run_ids: The runs measured.
    """

    gpu_id: str
    ratio: float
    run_ids: tuple[str, ...]


def memory_corrections(samples: Iterable[MemorySample], kind: JobKind) -> dict[str, MemoryCorrection]:
    """Per GPU type, the median measured/predicted peak of plausible samples of ``kind``."""
    ratios: dict[str, list[float]] = {}
    runs: dict[str, list[str]] = {}
    for sample in samples:
        if sample.kind != kind or sample.predicted_gb <= 0 or sample.measured_gb <= 0:
            continue
        ratio = sample.measured_gb / sample.predicted_gb
        if PLAUSIBLE_MEMORY_RATIO[0] <= ratio <= PLAUSIBLE_MEMORY_RATIO[1]:
            ratios.setdefault(sample.gpu_id, []).append(ratio)
            runs.setdefault(sample.gpu_id, []).append(sample.run_id)
    return {
        gpu: MemoryCorrection(gpu, round(statistics.median(values), 4), tuple(runs[gpu]))
        for gpu, values in ratios.items()
    }


def memory_note(corrections: dict[str, MemoryCorrection], gpus: Iterable[GpuSpec]) -> str | None:
    """Says which GPU types' peak memory comes from the user's runs of this job, and which runs, or None."""
    names = {gpu.id: gpu.name for gpu in gpus}
    parts = [
        f"{names.get(c.gpu_id, c.gpu_id)} from {_runs_words(Calibration(c.gpu_id, c.ratio, len(c.run_ids), c.run_ids))}"
        f" ({c.ratio:.2f}x the memory model)"
        for c in sorted(corrections.values(), key=lambda c: c.gpu_id)
    ]
    return "peak memory measured on your runs of this job: " + "; ".join(parts) if parts else None


@dataclass(frozen=True)
class Learned:
    """What the user's past runs teach a plan for one kind of job.

    Attributes:
        gpus: The GPU catalog with measured speeds applied.
        memory: Per GPU type, the measured peak memory correction for this kind of job.
        notes: Words naming what was measured and by which runs (empty: nothing learnt).
    """

    gpus: list[GpuSpec]
    memory: dict[str, MemoryCorrection]
    notes: tuple[str, ...] = ()

    @property
    def note(self) -> str | None:
        """The notes in one sentence, or None."""
        return "; ".join(self.notes) if self.notes else None
