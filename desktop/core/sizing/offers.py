"""A live offer judged against a plan: does the job fit its GPUs, for how many hours, for how many dollars.

The offer's price replaces the GPU's list price. A GPU the catalog does not know is judged on memory alone (its
reported VRAM): its speed is unknown, so hours and dollars stay unknown too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from desktop.core.sizing.architecture import Architecture
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.core.sizing.memory import estimate_memory
from desktop.core.sizing.plan import Fit, GpuOption, Workload, classify_fit, evaluate
from desktop.core.sizing.setup import Strategy, TrainingSetup

_FIT_ORDER = {Fit.FITS: 0, Fit.TIGHT: 1, Fit.NO: 2}
_FORMS = {"pcie": "PCIe", "sxm": "SXM", "nvl": "NVL"}
#: How far the catalog's memory may be from the offer's before the match is distrusted (A100 40 GB vs 80 GB).
VRAM_TOLERANCE = 0.15


@dataclass(frozen=True)
class OfferSizing:
    """The plan on one offer.

    Attributes:
        fit: Fits, tight, or does not fit.
        hours: Billed hours (None when the GPU's speed is unknown).
        total_usd: Hours times the offer's price for the whole machine (None when the hours are unknown).
    """

    fit: Fit
    hours: float | None
    total_usd: float | None


@dataclass(frozen=True)
class SizingJob:
    """What is being sized: the model, the setup as asked (its GPU count is the offer's), and the workload."""

    arch: Architecture
    setup: TrainingSetup
    workload: Workload


def _form_factor(names: tuple[str, ...]) -> str | None:
    """The board form ("PCIe", "SXM", "NVL") any of the names mentions.

    A provider's id often says what its display name does not: Lambda's ``gpu_1x_h100_pcie`` is an "H100".
    """
    squashed = " ".join(names).lower()
    return next((form for key, form in _FORMS.items() if key in squashed), None)


def _base(name: str) -> str:
    """The GPU's model without its form and memory: "A100 SXM4" and "NVIDIA A100 80GB PCIe" are both an A100."""
    words = name.replace("_", " ").split()
    return " ".join(w for w in words if not re.fullmatch(r"(pcie|sxm\d?|nvl|hbm\d?e?|\d+gb)", w.lower()))


def _candidates(name: str, form: str | None, vram_gb: float) -> list[str]:
    base = _base(name)
    return [*([f"{base} {form}"] if form else []), f"{base} {vram_gb:.0f}GB", base, name]


def match_gpu(gpus: list[GpuSpec], names: tuple[str, ...], vram_gb: float) -> GpuSpec | None:
    """The catalog GPU an offer names, if its memory agrees with the offer's.

    Args:
        gpus: The catalog.
        names: The offer's names for its GPU (display name, provider id).
        vram_gb: The offer's memory per GPU.

    Returns:
        The GPU, or None when no name matches a GPU with about that much memory.
    """
    form = _form_factor(names)
    for name in names:
        for candidate in _candidates(name, form, vram_gb):
            spec = find_gpu(gpus, candidate)
            if spec is not None and abs(spec.vram_gib - vram_gb) <= VRAM_TOLERANCE * vram_gb:
                return spec
    return None


def _setups(setup: TrainingSetup, count: int, nodes: int = 1) -> list[TrainingSetup]:
    strategies = [Strategy.DDP] if count * nodes == 1 else [Strategy.DDP, Strategy.FSDP]
    return [setup.with_gpus(count, strategy, nodes) for strategy in strategies]


def _best(options: list[GpuOption]) -> GpuOption:
    return min(options, key=lambda o: (_FIT_ORDER[o.fit], o.hours if o.fits else -o.headroom_gb))


def size_offer(job: SizingJob, gpu: GpuSpec, count: int, price_per_hour: float, nodes: int = 1) -> OfferSizing:
    """Judges ``nodes`` machines of ``count`` catalog GPUs at ``price_per_hour`` for all of them.

    DDP or FSDP, whichever does better.
    """
    priced = replace(gpu, list_price_usd_per_h=price_per_hour / (count * nodes))
    best = _best([evaluate(job.arch, setup, priced, job.workload) for setup in _setups(job.setup, count, nodes)])
    return OfferSizing(best.fit, best.hours, round(best.hours * price_per_hour, 2))


def size_unknown_gpu(job: SizingJob, count: int, vram_gb: float, nodes: int = 1) -> OfferSizing:
    """Judges ``nodes`` machines of ``count`` GPUs the catalog does not know, by memory alone (no hours, dollars)."""
    # Only the memory of this spec is read (classify_fit): its speed and price are never used.
    memory_only = GpuSpec("unknown", "unknown", vram_gb, 0.0, "pcie", 0.0, 0.0)
    peaks = [estimate_memory(job.arch, setup).per_gpu_total for setup in _setups(job.setup, count, nodes)]
    fit = min((classify_fit(peak, memory_only)[0] for peak in peaks), key=_FIT_ORDER.__getitem__)
    return OfferSizing(fit, None, None)
