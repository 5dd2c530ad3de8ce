"""Measure, then fit: the first steps of the real job measured once, and an out-of-memory in them met on the machine.

The calibration times the job's own first optimizer steps (its real micro-batch, sequence length and data) and reads
the GPU's peak memory: one ``calibration`` event. An out-of-memory error before that is not a failure: the job is
tried again with half the micro-batch and twice the accumulation (the same effective batch; the sequence length and
the data are never changed), down to a micro-batch of 1, with activation checkpointing switched on if it was off.
Only an out-of-memory at micro-batch 1 with checkpointing on fails the job. The failed attempt (its trainer, model,
optimizer and the error's frames) is let go and the GPU cache emptied before the smaller attempt loads, and the peak
starts again there: the retry has the whole card, and the calibration reports the peak of the attempt that fits.

``RENTUNE_TEST_MEMORY_LIMIT_BYTES`` (tests only) makes a step raise the framework's out-of-memory error when its
estimated activations pass that many bytes, so the fit can be proven on a CPU.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

from trainer_payload.protocol import JobSpec

TEST_LIMIT_ENV = "RENTUNE_TEST_MEMORY_LIMIT_BYTES"


@dataclass
class Calibration:
    """The first steps of the job, measured once.

    Attributes:
        steps: Optimizer steps to measure (0: no calibration).
        minutes: Measure at most this long (whichever of the two ends first).
        done: Whether the ``calibration`` event was sent.
    """

    steps: int
    minutes: float
    done: bool = False
    _base: tuple[float, int, float] | None = None  # (time, step, tokens) at the first logged step

    def on_log(self, step: int, tokens: float, now: float | None = None) -> dict[str, Any] | None:
        """Takes a logged step; returns the measurement once enough steps (or minutes) passed, else None."""
        if self.done or self.steps <= 0:
            return None
        now = time.monotonic() if now is None else now
        if self._base is None:
            self._base = (now, step, tokens)
            return None
        started, first, tokens_before = self._base
        measured = step - first
        if measured <= 0 or (measured < self.steps and now - started < self.minutes * 60):
            return None
        self.done = True
        seconds = now - started
        rate = (tokens - tokens_before) / seconds if seconds > 0 and tokens > tokens_before else None
        return {
            "steps": measured,
            "seconds_per_step": round(seconds / measured, 4),
            "tokens_per_s": round(rate, 1) if rate else None,
            **peak_memory(),
        }


def peak_memory() -> dict[str, float | None]:
    """Peak allocated and reserved GPU memory in GB (None on a CPU)."""
    import torch

    if not torch.cuda.is_available():
        return {"peak_allocated_gb": None, "peak_reserved_gb": None}
    return {
        "peak_allocated_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
        "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 3),
    }


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the framework running out of GPU (or test-limited) memory."""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def smaller_setup(spec: JobSpec) -> JobSpec | None:
    """The job with less memory per step and the same effective batch, or None when nothing is left to try.

    Half the micro-batch (its largest divisor up to half, so micro-batch times accumulation stays the same) and
    the accumulation multiplied to match; at micro-batch 1, activation checkpointing switched on if it was off.
    """
    if spec.micro_batch > 1:
        smaller = max(d for d in range(1, spec.micro_batch // 2 + 1) if spec.micro_batch % d == 0)
        grad_accum = spec.grad_accum * (spec.micro_batch // smaller)
        return dataclasses.replace(spec, micro_batch=smaller, grad_accum=grad_accum)
    if not spec.gradient_checkpointing:
        return dataclasses.replace(spec, gradient_checkpointing=True)
    return None


def forget_failure(exc: BaseException) -> None:
    """Lets go of what a failed attempt's exception keeps alive through its traceback.

    A traceback holds every frame the error passed through, with their locals: the trainer, the model, the optimizer
    and the step's activations (the test limit raises with the model and optimizer among its arguments, as a real
    step does). Clearing those frames, and the frames of the exceptions it was raised from or during, lets all of it
    be collected even while the exception object itself is still referenced somewhere.
    """
    for failure in _exception_chain(exc):
        traceback.clear_frames(failure.__traceback__)  # skips a frame still running (the loop that caught it)
        failure.__traceback__ = None


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it was raised from or while handling, each once."""
    chain: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or any(current is seen for seen in chain):
            continue
        chain.append(current)
        pending += [current.__cause__, current.__context__]
    return chain


def release_memory() -> None:
    """Gives the failed attempt's memory back before the next attempt loads, and forgets its peak.

    Call it once nothing references the failed attempt any more (outside the ``except`` block that caught its error,
    after :func:`forget_failure`): the collection frees its cycles (a trainer and its callbacks, a model and its
    wrapped ``forward``), the CUDA cache returns its blocks to the card, and the peak starts again from what is left,
    so the calibration reads the peak of the attempt that fits, its own load included, as for a job that fit at once.
    """
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def memory_limit_for_tests(spec: JobSpec, model_config: Any) -> Any:
    """A callback raising ``torch.OutOfMemoryError`` at a step whose activations pass the test limit; None unset.

    A step's activations are estimated as micro-batch x sequence length x hidden size x 4 bytes, for every layer
    without activation checkpointing and for one layer with it.
    """
    given = os.environ.get(TEST_LIMIT_ENV)
    if not given:
        return None
    limit = int(given)
    import torch
    from transformers import TrainerCallback

    layers = 1 if spec.gradient_checkpointing else int(getattr(model_config, "num_hidden_layers", 1))
    needed = spec.micro_batch * spec.seq_len * int(getattr(model_config, "hidden_size", 1)) * 4 * layers

    class TestMemoryLimit(TrainerCallback):  # type: ignore[misc]
        """Fails a step the way a GPU out of memory does (tests only)."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if needed > limit:
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory (test limit: this step needs {needed:,} bytes, {limit:,} allowed)"
                )

    return TestMemoryLimit()
