"""What the evaluation report says about the run an adapter came from: its loss curves, training time, GPU and cost.

The facts are read from the run's record by :func:`desktop.services.runs.run_facts.read_run_facts`; the report only
shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunFacts:
    """The run behind an adapter, as the report shows it.

    Attributes:
        run_id: The run.
        base_model: The base model it trained.
        method: ``qlora``, ``lora`` or ``full``.
        gpu: The GPU it trained on, when recorded.
        trained_seconds: Time spent training.
        usd: What it cost, or None when nothing priced it.
        losses: (step, training loss), in step order.
        eval_losses: (step, held-out loss), in step order.
        training: The run's training settings (method, rank, learning rate...), as its spec holds them.
        examples: Training rows the trainer used, when it said.
        tokens: Tokens it trained on, all epochs together, when it said.
    """

    run_id: str
    base_model: str
    method: str
    gpu: str | None
    trained_seconds: float
    usd: float | None
    losses: list[tuple[int, float]] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)
    examples: int | None = None
    tokens: float | None = None
