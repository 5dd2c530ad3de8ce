"""What the evaluation report says about the run an adapter came from: its loss curves, training time, GPU and cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from desktop.core.runs.progress import phase_durations
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import LedgerError
from desktop.services.billing.spend import priced_usd
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore, UnknownRunError
from trainer_payload.protocol import EventKind


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


def read_run_facts(store: RunStore, run_id: str, now: float) -> RunFacts | None:
    """The run's facts from its record, events and ledger (blocking); None when there is no such run."""
    try:
        record = store.get(run_id)
    except UnknownRunError:
        return None
    spec: dict[str, Any] = record.spec
    training: dict[str, Any] = spec["training"] if isinstance(spec.get("training"), dict) else {}
    compute: dict[str, Any] = spec["compute"] if isinstance(spec.get("compute"), dict) else {}
    spans = phase_durations(store.transitions(run_id), now)
    events = [dict(event) for event in mirrored_events(store.folder(run_id))]
    losses, eval_losses = _curves(events)
    return RunFacts(
        run_id=run_id,
        base_model=str(spec.get("base_model") or ""),
        method=str(training.get("method") or ""),
        gpu=str(compute["gpu"]) if compute.get("gpu") else None,
        trained_seconds=sum(s.seconds for s in spans if s.state is RunState.TRAINING),
        usd=_usd(store, run_id, now),
        losses=losses,
        eval_losses=eval_losses,
        training=dict(training),
        examples=_last(events, EventKind.STATE, "examples"),
        tokens=_last(events, EventKind.STEP, "tokens"),
    )


def _last(events: list[dict[str, Any]], kind: EventKind, name: str) -> Any:
    """The last number ``name`` an event of ``kind`` carried, or None."""
    found = [e[name] for e in events if e.get("event") == kind and isinstance(e.get(name), (int, float))]
    return found[-1] if found else None


def _curves(events: list[dict[str, Any]]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    losses: dict[int, float] = {}
    eval_losses: dict[int, float] = {}
    for values in events:
        step = values.get("step")
        if not isinstance(step, int):
            continue
        if values.get("event") == EventKind.STEP and isinstance(values.get("loss"), (int, float)):
            losses[step] = float(values["loss"])
        elif values.get("event") == EventKind.EVAL and isinstance(values.get("eval_loss"), (int, float)):
            eval_losses[step] = float(values["eval_loss"])
    return sorted(losses.items()), sorted(eval_losses.items())


def _usd(store: RunStore, run_id: str, now: float) -> float | None:
    try:
        return priced_usd(store, run_id, now=now)[0]
    except LedgerError:
        return None
