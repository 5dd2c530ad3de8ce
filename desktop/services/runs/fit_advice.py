"""What would fit, after a job ran out of memory even at micro-batch 1: the plan made again with the measured need.

The trainer fits a job that does not fit by itself (smaller micro-batches, activation checkpointing); when even that
runs out of memory, the card is too small for this job as the memory model saw it. The model was short by at least
what the card holds: the plan is made again with that measured need (a :class:`MemoryCorrection` on every GPU type),
and its cheapest option or its smallest changes are said in the Model step's words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.calibration import MemoryCorrection
from desktop.core.sizing.gpus import find_gpu
from desktop.core.sizing.memory import MemoryEstimate, estimate_memory
from desktop.core.sizing.plan import Plan, make_plan
from desktop.core.sizing.setup import DEFAULT_SETUP, TrainingSetup
from desktop.core.units import memory_text
from desktop.services.models.configs import ModelResolutionError, load_gpus, resolve_model
from desktop.services.models.sizing import SizingError, draft_workload, training_setup
from desktop.services.models.sizing_words import change_words, option_words
from desktop.services.platform.logs import get_logger
from desktop.services.runs.events import mirrored_events
from trainer_payload.protocol import EventKind

_log = get_logger("fit_advice")


def failed_setup(spec: dict[str, Any], folder: Path) -> TrainingSetup:
    """The setup that ran out of memory: the run's settings with the trainer's last fit (smaller micro-batch...).

    Raises:
        SizingError: The run's settings cannot be sized.
    """
    training = dict(spec.get("training") or {})
    predicted = spec.get("predicted")
    if isinstance(predicted, dict) and predicted.get("count"):
        training["num_gpus"] = int(predicted["count"])
    fits = [e for e in mirrored_events(folder) if e["event"] is EventKind.FIT]
    if fits:
        last = fits[-1]
        training |= {k: last[k] for k in ("micro_batch", "grad_accum", "gradient_checkpointing")}
    return training_setup(str(training.get("method", DEFAULT_SETUP.method.value)), training)


def measured_need(memory: MemoryEstimate, peak_gb: float | None, gpu_id: str | None) -> float:
    """How much the job needed per GPU, at least: the peak measured, or all its card could hold (whichever is more).

    Both as the framework's counters see it (without the CUDA context), like the model's ``counted_gb``.
    """
    gpu = find_gpu(list(load_gpus()), gpu_id) if gpu_id else None
    usable = gpu.usable_gb - memory.context_gb if gpu is not None else 0.0
    return max(float(peak_gb or 0.0), usable)


def oom_advice(spec: dict[str, Any], folder: Path, peak_gb: float | None, run_id: str) -> str | None:
    """What would fit, with the memory this run measured (blocking: may read the model's config).

    Returns:
        One or two sentences, or None when the run's GPU type and peak are both unknown or the model cannot be
        sized (the reason is logged).
    """
    predicted = spec.get("predicted")
    gpu_id = str(predicted["gpu"]) if isinstance(predicted, dict) and predicted.get("gpu") else None
    try:
        setup = failed_setup(spec, folder)
        arch = resolve_model(str(spec["base_model"]))
    except (SizingError, ModelResolutionError, ArchitectureError, KeyError) as exc:
        _log.info("no out-of-memory advice: %s", exc)
        return None
    memory = estimate_memory(arch, setup)
    modelled = memory.counted_gb
    need = measured_need(memory, peak_gb, gpu_id)
    if need <= 0 or modelled <= 0:
        return None
    correction = MemoryCorrection("*", round(max(1.0, need / modelled), 4), (run_id,))
    workload, _ = draft_workload(dict(spec.get("training") or {}), setup, None)
    plan = make_plan(arch, setup, list(load_gpus()), workload, measured={"*": correction})
    lead = f"It needed more than {memory_text(need)} per GPU (the plan said {memory_text(modelled)})"
    return f"{lead}. {_what_fits(plan)}"


def _what_fits(plan: Plan) -> str:
    """The cheapest option that fits with the measured need, else the smallest changes that make it fit."""
    fitting = [o for o in plan.options if o.fits]
    if fitting:
        option = fitting[0]
        return (
            f"With that measured, it fits on {option_words(option)} "
            f"({memory_text(option.memory.per_gpu_total)} per GPU, about ${option.cost_usd:,.2f})."
        )
    if not plan.suggestions:
        return "With that measured, nothing in the catalog fits it: choose a smaller model or QLoRA."
    best = plan.suggestions[0]
    changes = ", ".join(change_words(change) for change in best.changes)
    return (
        f"With that measured, it fits with {changes} on {option_words(best.option)} "
        f"({memory_text(best.option.memory.per_gpu_total)} per GPU, about ${best.option.cost_usd:,.2f})."
    )
