"""Presenting a plan: a JSON-ready dict and a human-readable text report."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from desktop.core.sizing.plan import GpuOption, Plan, SettingChange, Suggestion
from desktop.core.sizing.setup import TrainingSetup
from desktop.core.units import count_text, gib, memory_text

_ITEM_LABELS = {
    "weights": "base weights",
    "reference_model": "DPO reference model (frozen)",
    "lora_adapter": "LoRA adapter + grads + AdamW",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "logits": "logits + loss",
    "fsdp_buffers": "FSDP gathered layers (+ grads)",
    "allocator_overhead": "allocator fragmentation",
    "cuda_context": "CUDA context",
    "measured": "measured on your runs",
}
#: What a plan's objective changes, said after its setup (SFT and CPT: nothing).
_OBJECTIVE_WORDS = {
    "dpo": "\nDPO: both answers of each pair through the model, and the reference model's forward pass",
    "orpo": "\nORPO: both answers of each pair through the model (no reference model)",
}


def _objective_words(setup: TrainingSetup) -> str:
    """What the objective adds to the setup line, and where a full fine-tune's DPO reference comes from."""
    words = _OBJECTIVE_WORDS.get(setup.objective.value, "")
    if setup.objective.has_reference and not setup.method.is_peft:
        words += (
            "; its log-probabilities computed once before training (no frozen copy in memory)"
            if setup.reference_precomputed
            else "; a frozen copy of the model (a run capped at max steps keeps it: no pass over every pair first)"
        )
    return words


_POLICY = {
    "bf16": "bf16 weights, gradients and AdamW states (TRL with a bf16 model)",
    "mixed": "fp32 master weights and states with bf16 autocast",
}


def option_dict(option: GpuOption) -> dict[str, Any]:
    """One GPU option as JSON fields."""
    return {
        "gpu": option.gpu.name,
        "gpu_id": option.gpu.id,
        "count": option.count,
        "strategy": option.strategy.value,
        "fits": option.fits,
        "fit": option.fit.value,
        "per_gpu_gb": option.memory.per_gpu_total,
        "usable_gb": round(option.gpu.usable_gb, 2),
        "headroom_gb": option.headroom_gb,
        "tokens_per_s": option.tokens_per_s,
        "setup_hours": option.setup_hours,
        "training_hours": option.training_hours,
        "hours": option.hours,
        "price_usd_per_gpu_h": option.gpu.list_price_usd_per_h,
        "cost_usd": option.cost_usd,
        "usd_per_training_hour": round(option.usd_per_training_hour, 2),
        "spot_rework_hours": option.spot_rework_hours,
        "memory_measured_by": list(option.memory_measured_by),
        "nodes": option.nodes,
        "inter_node": f"{option.gpu.inter_node} {option.gpu.inter_node_gbps:g} Gb/s" if option.nodes > 1 else None,
    }


def plan_dict(plan: Plan, tokens_source: str) -> dict[str, Any]:
    """The whole plan as one JSON object (``rentune plan --json``)."""
    setup = plan.setup
    return {
        "model": plan.arch.name,
        "params_b": round(plan.arch.total_params / 1e9, 6),
        "trainable_params": plan.trainable_params,
        "method": setup.method.value,
        "precision_policy": _POLICY[setup.precision.value],
        "setup": {
            "lora_r": setup.lora_r,
            "targets": setup.targets.value,
            "seq_len": setup.seq_len,
            "micro_batch": setup.micro_batch,
            "grad_accum": setup.grad_accum,
            "grad_ckpt": setup.grad_ckpt,
            "num_gpus": setup.num_gpus,
            "strategy": setup.strategy.value,
            "objective": setup.objective.value,
        },
        "tokens": {"per_epoch": plan.workload.tokens, "epochs": plan.workload.epochs, "source": tokens_source},
        "memory_gb": {**plan.memory.items, "per_gpu_total": plan.memory.per_gpu_total},
        "options": [option_dict(option) for option in plan.options],
        "suggestions": [
            {"changes": [change_dict(change) for change in s.changes], **option_dict(s.option)}
            for s in plan.suggestions
        ],
    }


def format_hours(hours: float) -> str:
    """A duration for the plan: ``40 min``, ``2 h 05 min``, ``3 d 04 h`` (a day or more: minutes are noise).

    The total is rounded before it is split, so 59.6 min reads ``1 h 00 min`` and 359.7 min ``6 h 00 min``, never
    ``60 min``; under half a minute reads ``< 1 min``.
    """
    minutes = round(hours * 60)
    if minutes >= 24 * 60:
        days, rest = divmod(round(hours), 24)
        return f"{days} d {rest:02d} h"
    if minutes >= 60:
        whole, rest = divmod(minutes, 60)
        return f"{whole} h {rest:02d} min"
    return "< 1 min" if minutes == 0 and hours > 0 else f"{minutes} min"


def change_dict(change: SettingChange) -> dict[str, Any]:
    """A suggested change as JSON: the setting, its value before and after (enums by value), and why."""
    return {
        "setting": change.setting,
        "from": _plain_value(change.before),
        "to": _plain_value(change.after),
        "why": change.why,
    }


def _plain_value(value: object) -> object:
    return value.value if isinstance(value, Enum) else value


def plan_text(plan: Plan, tokens_source: str, describe: Callable[[Suggestion], str], limit: int = 10) -> str:
    """The plan as a report for the terminal; ``describe`` words a suggestion (the CLI names its flags)."""
    arch, setup = plan.arch, plan.setup
    lines = [
        f"{arch.name}: {count_text(arch.total_params)} parameters, {plan.trainable_params:,} trainable "
        f"({setup.method.value}, r={setup.lora_r}, {setup.targets.value})"
        if setup.method.is_peft
        else f"{arch.name}: {count_text(arch.total_params)} parameters, all trainable ({setup.method.value})",
        f"seq {setup.seq_len} x micro-batch {setup.micro_batch} x grad-accum {setup.grad_accum}, "
        f"checkpointing {'on' if setup.grad_ckpt else 'off'}; precision: {_POLICY[setup.precision.value]}"
        + _objective_words(setup),
        f"{plan.workload.tokens:,} tokens x {plan.workload.epochs:g} epochs ({tokens_source})",
        "",
        f"Peak memory per GPU ({setup.num_gpus} x {setup.strategy.value}), GiB:",
    ]
    lines += [f"  {_ITEM_LABELS[k]:<32}{gib(v):>9.2f}" for k, v in plan.memory.items.items() if v > 0]
    lines += [f"  {'total':<32}{gib(plan.memory.per_gpu_total):>9.2f}", "", _options_table(plan.options[:limit])]
    lines += multi_node_reasons(plan.options[:limit], plan.options)
    if plan.suggestions:
        where = "on one machine " if any(o.fits for o in plan.options) else ""
        lines += ["", f"Nothing fits {where}as configured. Changes that make it fit {where}:".replace(" :", ":")]
        lines += [
            f"  - {describe(s)}: {s.option.count} x {s.option.gpu.name}, {memory_text(s.option.memory.per_gpu_total)} "
            f"per GPU, {format_hours(s.option.hours)}, ${s.option.cost_usd:,.2f}"
            for s in plan.suggestions
        ]
    return "\n".join(lines)


def option_name(option: GpuOption) -> str:
    """``8 x H100 SXM fsdp``; several machines: ``2 machines x 8 x H100 SXM fsdp``."""
    name = f"{option.count} x {option.gpu.name}" + (f" {option.strategy.value}" if option.total_gpus > 1 else "")
    return f"{option.nodes} machines x {name}" if option.nodes > 1 else name


def multi_node_reasons(shown: list[GpuOption], options: list[GpuOption]) -> list[str]:
    """Why each multi-machine option shown needs its machines, over which network, and what it costs."""
    lines: list[str] = []
    for option in (o for o in shown if o.nodes > 1):
        one = next((o for o in options if o.gpu.id == option.gpu.id and o.nodes == 1 and o.count == option.count), None)
        if one is not None and not one.fits:
            why = f"one machine of {option_name(one)} needs {memory_text(one.memory.per_gpu_total)} per GPU of "
            why += f"{memory_text(option.gpu.usable_gb)} usable"
        else:
            hours = format_hours(one.hours) if one else "more than a working day"
            why = f"one machine of {option.count} x {option.gpu.name} would take {hours}"
        lines.append(
            f"{option.nodes} machines of {option.gpu.name}: {why}; across {option.nodes} machines "
            f"({option.gpu.inter_node_gbps:g} Gb/s {option.gpu.inter_node} between them) FSDP shards over "
            f"{option.total_gpus} GPUs: {memory_text(option.memory.per_gpu_total)} per GPU, "
            f"{format_hours(option.hours)}, ${option.cost_usd:,.2f}."
        )
    return ["", *lines] if lines else []


def _options_table(options: list[GpuOption]) -> str:
    width = max([22, *(len(option_name(o)) + 2 for o in options)])
    header = f"{'GPU':<{width}}{'fit':<28}{'tok/s':>9}{'time':>14}{'cost':>11}"
    rows = [header, "-" * len(header)]
    for o in options:
        name = option_name(o)
        if o.fit.value == "fits":
            fit = f"fits, {memory_text(o.headroom_gb)} headroom"
        elif o.fit.value == "tight":
            fit = f"tight, {memory_text(o.headroom_gb)} left"
        else:
            fit = f"does not fit ({memory_text(-o.headroom_gb)} over)"
        cost = "$" + format(o.cost_usd, ",.2f")
        rows.append(f"{name:<{width}}{fit:<28}{o.tokens_per_s:>9,.0f}{format_hours(o.hours):>14}{cost:>11}")
    measured = [o for o in options if o.memory_measured_by]
    if measured:
        rows.append(
            f"(memory of {', '.join(dict.fromkeys(o.gpu.name for o in measured))} as measured on run "
            f"{max(measured[0].memory_measured_by)}: {'+' if measured[0].memory.items['measured'] >= 0 else ''}"
            f"{memory_text(measured[0].memory.items['measured'])} on the model)"
        )
    return "\n".join(rows)
