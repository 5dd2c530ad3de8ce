"""Acting on the machine's first measured minutes: a new estimate, and, when it overruns, ask, go on or stop.

When the trainer's ``calibration`` event comes, the run's estimate is made again from the measured pace
(:func:`desktop.core.runs.overrun.reestimate`) and stored as ``measured`` in the run's spec. When the new total passes
the budget, or the estimate shown at launch by more than 25 %, the run's ``on_overrun`` policy decides:

- ``continue``: it is said, and training goes on;
- ``stop``: the trainer saves a checkpoint and stops (it comes home; a rented machine is then terminated);
- ``ask``: every rank of every machine holds at its next step boundary (:mod:`desktop.services.runs.hold`: its
  state kept, the machine billing) while the user is asked, for at most ``overrun_ask_seconds`` (10 minutes); then
  they all go on, or all save that step and stop. No answer in time is a stop; should the app be gone before it
  answers, the ranks stop by themselves a little after that limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from desktop.core.runs.overrun import Reestimate, reestimate
from desktop.core.runs.progress import cost_so_far, stored_estimate
from desktop.services.machines.machine import Machine
from desktop.services.runs import hold
from desktop.services.runs.context import RunContext
from desktop.services.runs.estimates import measured_memory
from trainer_payload.protocol import PauseRequest


class OnOverrun(StrEnum):
    """What happens when the measured estimate overruns."""

    ASK = "ask"
    CONTINUE = "continue"
    STOP = "stop"


def measured_estimate(ctx: RunContext, run_id: str, calibration: Mapping[str, Any], total_steps: int) -> Reestimate:
    """The run's estimate made again from its calibration (blocking: reads the run's record and spend)."""
    record = ctx.store.get(run_id)
    spec = record.spec
    rental = spec.get("rental")
    price = rental.get("price_per_hour") if isinstance(rental, dict) else None
    rate = float(price or spec.get("hourly_rate_usd") or 0.0)
    transitions = ctx.store.transitions(run_id)
    now = time.time()
    spent_hours = cost_so_far(1.0, transitions, now)  # billable hours: the cost at one dollar an hour
    spent_usd = ctx.spend(run_id) if ctx.spend else cost_so_far(rate, transitions, now)
    shown = stored_estimate(spec)
    return reestimate(
        calibration,
        total_steps=total_steps,
        spent=(spent_hours, spent_usd if rate else None),
        rate_per_hour=rate or None,
        shown=(shown.hours, shown.usd) if shown else (None, None),
        budget_usd=float(spec.get("budget_usd") or 0.0),
    )


async def judge_calibration(
    ctx: RunContext, run_id: str, machine: Machine, calibration: Mapping[str, Any], total_steps: int
) -> None:
    """Stores the measured estimate; on an overrun, asks, goes on or stops as the run's policy says.

    A calibration judged before (the app reattached and reads the events again) is not judged again.
    """
    if ctx.store.get(run_id).spec.get("measured"):
        return
    new = await asyncio.to_thread(measured_estimate, ctx, run_id, calibration, total_steps)
    measured: dict[str, Any] = {"hours": round(new.hours, 4), "usd": new.usd, "step": int(calibration["step"])}
    memory = await asyncio.to_thread(measured_memory, ctx.store.get(run_id).spec, dict(calibration))
    if memory is not None:
        measured["memory"] = memory  # later plans of the same job on this GPU type use it (estimates.learned_for)
    record = ctx.set_spec(run_id, measured=measured)
    words = f"measured in the first steps: {new.words()}"
    ctx.report(words)
    if not new.overrun:
        return
    policy = OnOverrun(record.spec.get("on_overrun") or ctx.options.on_overrun)  # the run's own, when it has one
    if policy is OnOverrun.CONTINUE:
        ctx.report("over the estimate: training goes on, as asked (--on-overrun continue)")
        return
    asking = policy is OnOverrun.ASK and ctx.ask_overrun is not None and record.pid
    if asking and await _ask_held(ctx, run_id, machine, words):
        ctx.report("you chose to go on: training continues")
        return
    ctx.report(f"{words}: asking the trainer to save a checkpoint and stop")
    ctx.set_spec(run_id, overrun_stop=words)  # remembered, so a reattached app ends it the same way
    if record.pid:
        await machine.run(f"kill -TERM {int(record.pid)} 2>/dev/null || true")


async def _ask_held(ctx: RunContext, run_id: str, machine: Machine, words: str) -> bool:
    """Holds every rank, asks whether to go on (at most the ask limit) and gives the ranks the answer; True to go on.

    Cut short (the app closes while asking), the pause file stays: the ranks stop by themselves, with a checkpoint,
    once they have held past the limit and a grace, as no answer in time is a stop.
    """
    assert ctx.ask_overrun is not None
    record = ctx.store.get(run_id)
    limit = ctx.options.overrun_ask_seconds
    request = PauseRequest(hold_seconds=limit + hold.HOLD_GRACE_SECONDS)
    await hold.ask_to_hold(machine, record, request)
    ctx.report(
        f"paused while you decide (training holds at its next step, on every GPU; at most {limit / 60:.0f} minutes; "
        "the machine bills meanwhile)"
    )
    try:
        go_on = await asyncio.wait_for(ctx.ask_overrun(run_id, words), limit)
    except TimeoutError:
        ctx.report(f"no answer in {limit / 60:.0f} minutes: stopping, with a checkpoint")
        go_on = False
    await (hold.let_go(machine, record) if go_on else hold.answer_stop(machine, record, request))
    return go_on
