"""A trial on this computer before anything is rented: where it can run, on how much data, and what it proved (pure).

A trial trains a few dozen steps on a slice of the data: enough to see the loss fall on the chat template and labels
the real run will use, to measure this computer's speed and memory, and to leave an adapter whose first answers
can be read. Apple Silicon trains with mlx-lm's LoRA trainer; a computer with an NVIDIA GPU with the payload itself;
any other computer with the payload on its CPU, for small models only: a trial that would take longer than
:data:`MAX_TRIAL_MINUTES` or more memory than the computer has is "too big to try here".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

#: The slice of the data a trial trains on by default (1 %), and the steps it takes at most.
DEFAULT_SLICE = 0.01
DEFAULT_STEPS = 50
#: A trial never trains on fewer rows than this (a 1 % slice of a small dataset would be a handful).
MIN_ROWS = 16
#: A trial expected to take longer than this is not offered on the CPU.
MAX_TRIAL_MINUTES = 20.0
#: Share of this computer's memory a trial may plan to use.
MEMORY_SHARE = 0.6
#: How far the late steps' loss must be under the early steps' for the loss to count as falling.
FALL_MARGIN = 0.02


class TrialBackend(StrEnum):
    """What trains the trial."""

    MLX = "mlx"
    GPU = "gpu"
    CPU = "cpu"

    @property
    def label(self) -> str:
        """How the app names it."""
        return {
            "mlx": "MLX (mlx-lm's LoRA trainer)",
            "gpu": "this computer's NVIDIA GPU",
            "cpu": "this computer's CPU",
        }[self.value]


@dataclass(frozen=True)
class Machine:
    """This computer as the trial sees it.

    Attributes:
        apple_silicon: A Mac with an M-series chip (MLX trains there).
        cuda_gb: The NVIDIA GPU's memory in GB (0: none).
        memory_gb: The computer's memory in GB.
        cpu_count: Its logical CPUs.
    """

    apple_silicon: bool
    cuda_gb: float
    memory_gb: float
    cpu_count: int


@dataclass(frozen=True)
class TrialPlan:
    """Where and how a trial runs, or why it cannot.

    Attributes:
        backend: What trains it (None: too big to try here).
        rows: Rows of the training data it trains on.
        steps: Optimizer steps.
        reason: Why it runs there, or why it cannot run here.
        flops_per_token: Training FLOPs per token of the trial's setup (0: unknown), to turn its measured tokens
            per second into this computer's training throughput.
        memory_gb: The memory it trains in: the GPU's, or the computer's.
    """

    backend: TrialBackend | None
    rows: int
    steps: int
    reason: str
    flops_per_token: float = 0.0
    memory_gb: float = 0.0

    @property
    def possible(self) -> bool:
        """Whether the trial can run on this computer."""
        return self.backend is not None


def slice_rows(total_rows: int, share: float = DEFAULT_SLICE) -> int:
    """Rows of a ``total_rows`` dataset a trial trains on: ``share`` of them, at least :data:`MIN_ROWS` (or all)."""
    return min(total_rows, max(MIN_ROWS, math.ceil(total_rows * share)))


def plan_trial(
    machine: Machine,
    *,
    params_b: float,
    train_gb: float,
    total_rows: int,
    cpu_minutes: float,
    steps: int = DEFAULT_STEPS,
    share: float = DEFAULT_SLICE,
    backend: TrialBackend | None = None,
) -> TrialPlan:
    """Where a trial of a ``params_b`` billion-parameter model needing ``train_gb`` GB to train can run.

    Args:
        machine: This computer.
        params_b: The model's size.
        train_gb: Memory its LoRA training needs (weights, adapter, activations of one micro-batch).
        total_rows: Rows of the training data.
        cpu_minutes: The trial's expected minutes on this computer's CPU.
        steps: Optimizer steps.
        share: Share of the rows.
        backend: A backend the user chose (None: the best this computer has).
    """
    rows = slice_rows(total_rows, share)
    chosen = backend or best_backend(machine)
    room = {TrialBackend.GPU: machine.cuda_gb * 0.9}.get(chosen, machine.memory_gb * MEMORY_SHARE)
    if train_gb > room:
        return TrialPlan(None, rows, steps, _too_big(params_b, train_gb, room, chosen))
    if chosen is TrialBackend.CPU and cpu_minutes > MAX_TRIAL_MINUTES:
        return TrialPlan(
            None,
            rows,
            steps,
            f"too big to try here: {params_b:g} B parameters would train about {cpu_minutes:.0f} minutes on this "
            f"computer's CPU (a trial is kept under {MAX_TRIAL_MINUTES:.0f}); rent for it, or try a smaller model",
        )
    memory = machine.cuda_gb if chosen is TrialBackend.GPU else machine.memory_gb
    return TrialPlan(chosen, rows, steps, f"{steps} steps on {rows} rows with {chosen.label}", memory_gb=memory)


def best_backend(machine: Machine) -> TrialBackend:
    """MLX on Apple Silicon, the NVIDIA GPU where there is one, else the CPU."""
    if machine.apple_silicon:
        return TrialBackend.MLX
    return TrialBackend.GPU if machine.cuda_gb > 0 else TrialBackend.CPU


def _too_big(params_b: float, need: float, room: float, backend: TrialBackend) -> str:
    return (
        f"too big to try here: training {params_b:g} B parameters needs about {need:.1f} GB and {backend.label} "
        f"has {room:.1f} GB for it; rent for it, or try a smaller model"
    )


@dataclass(frozen=True)
class TrialStep:
    """One optimizer step of a trial: its loss and, where measured, the tokens per second."""

    step: int
    loss: float
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class Answer:
    """A held-out prompt, the answer the data gives, and the trial adapter's first answer."""

    prompt: str
    expected: str
    answer: str


@dataclass(frozen=True)
class TrialResult:
    """What a trial proved and measured.

    Attributes:
        backend: What trained it.
        steps: Its steps in order.
        seconds: Time spent training.
        peak_memory_gb: The most memory the trainer used.
        answers: First answers to held-out prompts.
        adapter: The adapter folder (PEFT format, for Chat).
        run_id: The run it is listed under.
    """

    backend: TrialBackend
    steps: tuple[TrialStep, ...]
    seconds: float
    peak_memory_gb: float | None
    answers: tuple[Answer, ...] = ()
    adapter: str = ""
    run_id: str = ""

    @property
    def tokens_per_s(self) -> float | None:
        """Median training speed over the steps that measured it (the first step warms up and is left out)."""
        speeds = [s.tokens_per_s for s in self.steps[1:] if s.tokens_per_s]
        return statistics.median(speeds) if speeds else None

    def achieved_tflops(self, flops_per_token: float) -> float | None:
        """This computer's training throughput in TFLOPS: the measured tokens per second times FLOPs per token."""
        speed = self.tokens_per_s
        return speed * flops_per_token / 1e12 if speed and flops_per_token > 0 else None

    @property
    def loss_start(self) -> float | None:
        """Mean loss of the first fifth of the steps."""
        return _mean([s.loss for s in self.steps[: _fifth(self.steps)]])

    @property
    def loss_end(self) -> float | None:
        """Mean loss of the last fifth of the steps."""
        return _mean([s.loss for s in self.steps[-_fifth(self.steps) :]])

    @property
    def loss_falls(self) -> bool:
        """Whether the loss fell: the last fifth's mean under the first fifth's by :data:`FALL_MARGIN` of it."""
        start, end = self.loss_start, self.loss_end
        return start is not None and end is not None and len(self.steps) >= 2 and end < start * (1 - FALL_MARGIN)

    def as_dict(self) -> dict[str, Any]:
        """The result as the CLI's JSON gives it."""
        return {
            "backend": self.backend.value,
            "steps": len(self.steps),
            "seconds": self.seconds,
            "loss_start": self.loss_start,
            "loss_end": self.loss_end,
            "loss_falls": self.loss_falls,
            "tokens_per_s": self.tokens_per_s,
            "peak_memory_gb": self.peak_memory_gb,
            "adapter": self.adapter,
            "run_id": self.run_id,
            "answers": [{"prompt": a.prompt, "expected": a.expected, "answer": a.answer} for a in self.answers],
            "losses": [s.loss for s in self.steps],
        }


def _fifth(steps: Sequence[TrialStep]) -> int:
    return max(1, len(steps) // 5)


def _mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None
