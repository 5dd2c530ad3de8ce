"""The facts of a run an evaluation report and a model card show: read from its record, events and ledger."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from desktop.core.runs.progress import phase_durations
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import LedgerError
from desktop.services.billing.spend import priced_usd
from desktop.services.evaluation.run_facts import RunFacts
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore, UnknownRunError
from trainer_payload.protocol import EventKind


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


async def run_facts_of(store: RunStore | None, run_id: str | None) -> RunFacts | None:
    """:func:`read_run_facts` off the event loop, now; None without a run (an adapter from elsewhere)."""
    if run_id is None:
        return None
    return await asyncio.to_thread(read_run_facts, store or RunStore(), run_id, time.time())
