"""Following the trainer on its machine: its event stream read into the local mirror, its liveness, its budget.

A spent budget asks the trainer to save a checkpoint and stop; its failed event then cancels the run.
"""

from __future__ import annotations

import asyncio
import time

from desktop.core.runs.progress import cost_so_far
from desktop.core.runs.states import RunState
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import READ_LIMIT
from desktop.services.platform.logs import get_logger
from desktop.services.runs.checkpoints import newest_local_checkpoint
from desktop.services.runs.context import RunContext
from desktop.services.runs.events import EventLine, append_mirror, ascending, describe_event
from desktop.services.runs.store import RunRecord
from trainer_payload.protocol import EVENTS_FILE_NAME, Event, UnsafePathError, parse_event_chunk

_log = get_logger("engine")


async def read_events(ctx: RunContext, run_id: str, machine: Machine) -> list[Event] | None:
    """New events since the stored offset, mirrored locally; None when the events file is gone.

    Raises:
        PermanentError: An event names an unsafe path.
    """
    record = ctx.store.get(run_id)
    data = await machine.read_from(f"{record.remote_dir}/out/{EVENTS_FILE_NAME}", record.events_offset)
    if data is None:
        return None
    try:
        chunk = parse_event_chunk(data, limit=READ_LIMIT)
    except UnsafePathError as exc:
        raise PermanentError(f"the machine sent an unsafe path: {exc}") from None
    used, skipped = chunk.used, chunk.skipped
    if skipped:
        _log.warning("run %s: skipped event lines from the machine: %s", run_id, "; ".join(skipped))
        ctx.report(f"skipped {len(skipped)} malformed event line(s) from the machine: {skipped[0]}")
    fresh = ascending(chunk.events, record.last_seq)
    # The mirror dedupes by seq and is fsynced before the offset moves: a crash in between repeats nothing.
    last = await asyncio.to_thread(append_mirror, ctx.folder(run_id), fresh) if fresh else record.last_seq
    ctx.store.update(run_id, events_offset=record.events_offset + used, last_seq=max(last, record.last_seq))
    for event in fresh:
        ctx.report(EventLine(describe_event(event)))
    return fresh


async def alive(machine: Machine, record: RunRecord) -> bool:
    """Whether the run's trainer process still runs (a zombie does not)."""
    status = await machine.run(f"cat /proc/{int(record.pid or 0)}/status 2>/dev/null || true")
    return bool(status) and "\nState:\tZ" not in status


async def until_exited(machine: Machine, record: RunRecord, poll_seconds: float, limit: float = 120.0) -> bool:
    """Waits (at most ``limit`` seconds) until the run's trainer process has exited; whether it did.

    A stopped trainer says so before it is gone (it still writes its files and unloads); a resume must find no
    trainer in the folder, or it would follow the one on its way out.
    """
    deadline = time.monotonic() + limit
    while await alive(machine, record):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_seconds)
    return True


def over_budget(ctx: RunContext, run_id: str) -> str | None:
    """Why the run must stop for its budget (the cost so far as the monitor counts it), or None."""
    spec = ctx.store.get(run_id).spec
    budget, rate = float(spec.get("budget_usd") or 0.0), float(spec.get("hourly_rate_usd") or 0.0)
    if budget <= 0 or rate <= 0 or spec.get("budget_stop"):
        return None
    spent = ctx.spend(run_id) if ctx.spend else cost_so_far(rate, ctx.store.transitions(run_id), time.time())
    return f"budget of ${budget:,.2f} reached (${spent:,.2f} at ${rate:,.2f}/h)" if spent >= budget else None


async def stop_if_over_budget(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Asks the trainer to save and stop once the budget is spent; its failed event then ends the run."""
    why = over_budget(ctx, run_id)
    if why is None:
        return
    ctx.report(f"{why}: asking the trainer to save a checkpoint and stop")
    record = ctx.set_spec(run_id, budget_stop=why)  # remembered, so a reattached app ends it the same way
    if record.pid:
        await machine.run(f"kill -TERM {int(record.pid)} 2>/dev/null || true")


def cancel_stopped(ctx: RunContext, run_id: str, reason: str) -> RunRecord:
    """Ends a run whose trainer stopped on SIGTERM; a budget stop says so and where its checkpoint is."""
    spec = ctx.store.get(run_id).spec
    budget = spec.get("budget_stop") or spec.get("overrun_stop")  # stopped by the app for money, not the user
    if not budget:
        return ctx.end(run_id, RunState.CANCELLED, reason)
    newest = newest_local_checkpoint(ctx.folder(run_id) / "checkpoints")
    where = f"the newest checkpoint is at {newest}" if newest else "no checkpoint had been written"
    why = f"{budget}; training was stopped and {where}"
    ctx.report(f"cancelled: {why}")
    ctx.store.update(run_id, error=why)
    return ctx.end(run_id, RunState.CANCELLED, why)
