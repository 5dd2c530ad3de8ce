"""How the app words a sizing: whether a GPU option fits, and a suggested change in the Model step's names.

The core returns data (options, setting changes); the CLI words them as flags, the app (the wizard's pages, a run's
out-of-memory advice) as the Model step's labels here.
"""

from __future__ import annotations

from desktop.core.sizing.plan import Fit, GpuOption, SettingChange
from desktop.core.sizing.setup import Method, Strategy
from desktop.core.units import memory_text
from desktop.services.models.sizing import SETTING_LABELS


def fit_text(option: GpuOption) -> str:
    """Whether an option fits, with the memory to spare or missing per GPU."""
    if option.fit is Fit.FITS:
        return f"fits, {memory_text(option.headroom_gb)} free"
    if option.fit is Fit.TIGHT:
        return f"tight, {memory_text(option.headroom_gb)} left"
    return f"does not fit, {memory_text(-option.headroom_gb)} over"


def fit_severity(option: GpuOption) -> str:
    """The colour of an option's fit: ``success``, ``warning`` (tight) or ``danger``."""
    return {Fit.FITS: "success", Fit.TIGHT: "warning", Fit.NO: "danger"}[option.fit]


def method_words(method: Method) -> str:
    """A fine-tuning method as the Model step names it."""
    return _METHOD_LABELS[method]


def option_words(option: GpuOption) -> str:
    """An option as people read it: ``L40S``, ``4 H100 SXM GPUs with FSDP``, ``2 machines of 8 H100 SXM GPUs ...``."""
    if option.total_gpus == 1:
        return option.gpu.name
    if option.nodes > 1:
        return f"{option.nodes} machines of {option.count} {option.gpu.name} GPUs with {option.strategy.value.upper()}"
    return f"{option.count} {option.gpu.name} GPUs with {option.strategy.value.upper()}"


def split_words(option: GpuOption) -> str:
    """How an option spreads the job: ``on one GPU`` or ``on each of 8 GPUs, sharded with FSDP``."""
    if option.total_gpus == 1:
        return "on one GPU"
    how = "sharded with FSDP" if option.strategy is Strategy.FSDP else "a full copy on each, with DDP"
    return f"on each of {option.total_gpus} GPUs, {how}"


_METHOD_LABELS = {
    Method.QLORA: "QLoRA",
    Method.LORA: "LoRA",
    Method.FULL: "full fine-tune",
    Method.FULL_8BIT: "full fine-tune with 8-bit AdamW",
}


def change_words(change: SettingChange) -> str:
    """A suggested change as the Model step names it: ``gradient accumulation 16``, ``QLoRA``, ``8 GPUs``."""
    if change.setting == "grad_ckpt":
        return f"gradient checkpointing {'on' if change.after else 'off'}"
    if isinstance(change.after, Method):
        return _METHOD_LABELS[change.after]
    if isinstance(change.after, Strategy):
        return change.after.value.upper()
    if change.setting == "num_gpus":
        return f"{change.after} GPUs"
    return f"{SETTING_LABELS.get(change.setting, change.setting)} {change.after}"
