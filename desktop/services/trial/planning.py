"""Where a run's trial can run on this computer, and the payload job it trains.

The trial keeps what it must prove, the run's base model, chat template, labels, method's adapter and learning rate,
and makes the rest small: one chat per step, sequences of at most :data:`TRIAL_SEQ_LEN` tokens, no checkpoints.
QLoRA trains as LoRA here (its 4-bit kernels need a CUDA GPU and bitsandbytes; the adapter is the same kind).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from desktop.core.runs.spec import RunSpec
from desktop.core.runs.trial import (
    DEFAULT_SLICE,
    DEFAULT_STEPS,
    Machine,
    TrialBackend,
    TrialPlan,
    best_backend,
    plan_trial,
)
from desktop.core.sizing.architecture import Architecture
from desktop.core.sizing.memory import estimate_memory
from desktop.core.sizing.setup import Method, TrainingSetup
from desktop.core.sizing.throughput import flops_per_token
from desktop.services.models.configs import ConfigFetcher, resolve_model

#: The longest sequence a trial trains on.
TRIAL_SEQ_LEN = 512
#: What one CPU core reaches training in float32, in GFLOP/s: a planning figure; the trial measures the real one.
CPU_GFLOPS_PER_CORE = 20.0


def trial_job(spec: RunSpec, plan: TrialPlan) -> dict[str, Any]:
    """The payload job of the trial: the run's model and labels, small shapes, ``plan.steps`` steps, no checkpoints."""
    training = spec.training
    job = spec.job_dict("data/train.jsonl", None)
    job.update(
        method=Method.LORA.value if training.get("method", "qlora") == Method.QLORA.value else training["method"],
        seq_len=min(int(training.get("seq_len", TRIAL_SEQ_LEN)), TRIAL_SEQ_LEN),
        micro_batch=1,
        grad_accum=1,
        max_steps=plan.steps,
        checkpoint_steps=0,
        checkpoint_minutes=0,
        eval_file=None,
    )
    return job


def trial_setup(spec: RunSpec) -> TrainingSetup:
    """The trial's shapes as the sizing sees them."""
    rank = int(spec.training.get("lora_r", TrainingSetup().lora_r))
    seq_len = min(int(spec.training.get("seq_len", TRIAL_SEQ_LEN)), TRIAL_SEQ_LEN)
    return replace(TrainingSetup(), method=Method.LORA, lora_r=rank, seq_len=seq_len, micro_batch=1, grad_accum=1)


def plan_for_spec(
    spec: RunSpec,
    machine: Machine,
    total_rows: int,
    *,
    steps: int = DEFAULT_STEPS,
    share: float = DEFAULT_SLICE,
    backend: TrialBackend | None = None,
    fetch: ConfigFetcher | None = None,
) -> TrialPlan:
    """Where the trial of ``spec`` runs here (blocking: may read the model's config from the Hub).

    Raises:
        ModelResolutionError: The base model cannot be found.
        ArchitectureError: Its config cannot be sized.
    """
    arch = resolve_model(spec.base_model, fetch)
    setup = trial_setup(spec)
    float32 = (backend or best_backend(machine)) is TrialBackend.CPU  # the payload trains in float32 on a CPU
    train_gb = estimate_memory(arch, setup).counted_gb * (2.0 if float32 else 1.0)
    plan = plan_trial(
        machine,
        params_b=round(arch.total_params / 1e9, 2),
        train_gb=train_gb,
        total_rows=total_rows,
        cpu_minutes=cpu_minutes(arch, setup, steps, machine.cpu_count),
        steps=steps,
        share=share,
        backend=backend,
    )
    return replace(plan, flops_per_token=flops_per_token(arch, setup))


def cpu_minutes(arch: Architecture, setup: TrainingSetup, steps: int, cores: int) -> float:
    """Planned minutes of ``steps`` trial steps on ``cores`` CPU cores."""
    flops = flops_per_token(arch, setup) * setup.seq_len * setup.micro_batch * setup.grad_accum * steps
    return flops / (cores * CPU_GFLOPS_PER_CORE * 1e9) / 60
