"""The run's log in words (pure: no Qt): its history, the trainer's milestones, its machines, the engine's notes.

They are merged in time order. A finished run's log is built from its files alone (the recorded transitions and the
mirrored events), so it reads the same whether this window followed the run or opened it a week later.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from desktop.core.runs.progress import format_duration
from desktop.core.runs.states import RunState
from desktop.core.runs.timeline import MachineMark
from desktop.core.units import memory_text
from desktop.ui.cost_words import money, rate
from desktop.ui.pages.monitor_text import ERROR_WORDS
from desktop.ui.run_words import provider_word
from trainer_payload.protocol import EventKind, HoldOutcome, JobState

#: How the run's own transitions read (the paused, failed and stopped ones add their reasons).
_TRANSITION_WORDS = {
    RunState.PLANNED: "Run created",
    RunState.PROVISIONING: "Renting a machine",
    RunState.CONNECTING: "Connecting to the machine",
    RunState.UPLOADING: "Uploading the trainer and the data",
    RunState.BOOTSTRAPPING: "Setting up the machine: the trainer's packages and the model",
    RunState.TRAINING: "Starting the trainer",
    RunState.SYNCING: "Training done: bringing the newest checkpoint home",
    RunState.PULLING: "Bringing the adapter home",
    RunState.SERVING: "Serving the tuned model from the machine",
}


@dataclass(frozen=True)
class LogEntry:
    """One line of the log: when, and what happened."""

    ts: float
    text: str


@dataclass(frozen=True)
class StopContext:
    """What the log needs to word a stop: who asked, and the steps of the checkpoints the trainer saved."""

    by_user: bool
    budget: str
    stop_steps: tuple[tuple[float, int | None], ...]  # (when the trainer stopped, the step it saved)


def stop_steps(milestones: Iterable[Mapping[str, Any]]) -> tuple[tuple[float, int | None], ...]:
    """When the trainer stopped on request, and the step of the checkpoint it saved.

    The step is the stop event's field; event files written before the field existed give the newest checkpoint
    before the stop instead.
    """
    found, newest = [], None
    for event in milestones:
        if event.get("event") == EventKind.CHECKPOINT:
            newest = int(event["step"])
        elif event.get("event") == EventKind.STATE and event.get("stopped_by"):
            step = event.get("checkpoint_step")
            found.append((float(event.get("ts") or 0.0), step if isinstance(step, int) else newest))
    return tuple(found)


def log_lines(entries: Iterable[LogEntry]) -> list[str]:
    """The entries in time order, each ``HH:MM:SS  text``; a line with the date opens each new day."""
    lines, day = [], ""
    for entry in sorted(entries, key=lambda e: e.ts):
        moment = time.localtime(entry.ts)
        today = time.strftime("%A %d %B %Y", moment)
        if today != day:
            lines.append(f"— {today} —")
            day = today
        lines.append(f"{time.strftime('%H:%M:%S', moment)}  {entry.text}")
    return lines


def transition_entries(transitions: Sequence[Mapping[str, Any]], stops: StopContext) -> list[LogEntry]:
    """The run's state history in words; the last stop says who stopped it and which checkpoint was kept."""
    entries = []
    cancels = [index for index, row in enumerate(transitions) if row["to_state"] == RunState.CANCELLED.value]
    for index, row in enumerate(transitions):
        text = transition_text(row, stops, last_stop=bool(cancels) and index == cancels[-1])
        if text:
            entries.append(LogEntry(float(row["ts"]), text))
    return entries


def transition_text(row: Mapping[str, Any], stops: StopContext, *, last_stop: bool = False) -> str:
    """One transition in words."""
    state, note = RunState(str(row["to_state"])), str(row.get("note") or "").strip()
    if state is RunState.PAUSED and row.get("from_state") == RunState.CANCELLED.value:
        return "Resumed by you: continuing from the newest checkpoint"
    if state is RunState.CANCELLED:
        return stop_text(float(row["ts"]), note, stops, last_stop)
    if state is RunState.TRAINING and note.startswith("following the trainer"):
        return "Following the trainer already running on the machine"
    if state is RunState.FINISHED:
        where = note.removeprefix("adapter at ")
        return "Finished: the adapter is on this computer" + (f", in {where}" if where else "")
    with_reason = _WITH_REASON.get(state)
    if with_reason is not None:
        return f"{with_reason}: {note}" if note else with_reason
    return _TRANSITION_WORDS.get(state, state.value.capitalize())


#: Transitions whose note is worth showing after their words: why it paused or failed.
_WITH_REASON = {
    RunState.PAUSED: "Paused",
    RunState.FAILED: "Failed",
}


def stop_text(ts: float, note: str, stops: StopContext, last_stop: bool) -> str:
    """``Stopped by you — checkpoint at step 30 kept`` (the step from the trainer's stop event, never its words)."""
    if last_stop and stops.budget:
        who = "Stopped at its budget"
    elif last_stop and stops.by_user:
        who = "Stopped by you"
    else:
        who = "Stopped"
    if note == "stopped before the trainer started":
        return f"{who} before training began"
    step = next((step for at, step in reversed(stops.stop_steps) if at <= ts + 1.0), None)
    if step is not None:
        return f"{who} — checkpoint at step {step:,} kept"
    if note.startswith("stopped while the machine was unreachable"):
        return f"{who} while the machine could not be reached; the newest checkpoint on this computer is kept"
    return f"{who} — no checkpoint had been written"


def event_entries(milestones: Iterable[Mapping[str, Any]]) -> list[LogEntry]:
    """The trainer's milestones in words (an event with nothing to say for people gives no line)."""
    entries = []
    for event in milestones:
        text = event_text(event)
        if text:
            entries.append(LogEntry(float(event.get("ts") or 0.0), text))
    return entries


def event_text(event: Mapping[str, Any]) -> str | None:
    """One of the trainer's events in words; None for those that only show as progress."""
    words = _EVENT_WORDS.get(str(event.get("event")))
    return words(event) if words is not None else None


def _step_text(event: Mapping[str, Any]) -> str:
    total = f" of {event['total_steps']:,}" if event.get("total_steps") else ""
    return f"First step of this session: step {event['step']:,}{total}, loss {float(event['loss']):.4f}"


def _error_text(event: Mapping[str, Any]) -> str:
    words, fix = ERROR_WORDS.get(str(event.get("kind")), ("The trainer failed", str(event.get("hint") or "")))
    return f"{words}: {event.get('message')}. What to do: {fix}"


def state_text(event: Mapping[str, Any]) -> str | None:
    """A phase the trainer or its setup reported, in words (None when its progress line says enough)."""
    words = _STATE_WORDS.get(str(event.get("state")))
    if words is None:
        return f"The trainer reports: {event.get('state')}"
    return words(event)


def _downloading_text(event: Mapping[str, Any]) -> str:
    took = event.get("install_seconds")
    ready = f"Packages ready after {format_duration(float(took))}; " if isinstance(took, int | float) else ""
    return f"{ready}downloading the model {event.get('model', '')}".strip()


def _preparing_text(event: Mapping[str, Any]) -> str:
    if event.get("ready") is not True:
        return "Loading the model and the data"
    took = event.get("ready_seconds")
    return "Machine ready" + (f" after {format_duration(float(took))}" if isinstance(took, int | float) else "")


def _failed_text(event: Mapping[str, Any]) -> str | None:
    if not event.get("stopped_by"):
        return None  # a failure: its error event says what happened
    step = event.get("checkpoint_step")
    saved = f"saved a checkpoint at step {step:,} and " if isinstance(step, int) else ""
    return f"The trainer {saved}stopped"


def _installing_text(event: Mapping[str, Any]) -> str | None:
    step, detail = event.get("step"), str(event.get("detail") or "")
    if step == "check":
        gpus = event.get("gpus")
        found = ", ".join(str(g).split(",")[0] for g in gpus) if isinstance(gpus, list) and gpus else "no NVIDIA GPU"
        python = f", Python {event['python']}" if event.get("python") else ""
        return f"Machine checked: {found}{python}; {detail}" if detail else f"Machine checked: {found}{python}"
    if step == "environment":
        return "Creating the trainer's own Python environment"
    if detail.startswith("installing "):
        return "Installing the trainer's packages"
    return None  # one line per package pip collects: the progress line shows enough


def _training_text(event: Mapping[str, Any]) -> str:
    examples = event.get("examples")
    text = f"Training on {examples:,} examples" if isinstance(examples, int) else "Training"
    if event.get("resume_from"):
        text += f", continuing from {event['resume_from']}"
    dropped = event.get("dropped_examples")
    if isinstance(dropped, int) and dropped:
        text += f" ({dropped:,} left out: too long or without an answer to learn)"
    tracking = event.get("tracking")
    if isinstance(tracking, str) and tracking:  # a tracker that could not start: the training went on without it
        text += f". {tracking[:400]}"
    return text


def _saving_text(_event: Mapping[str, Any]) -> str:
    return "Saving the adapter"


def _done_state_text(_event: Mapping[str, Any]) -> None:
    return None  # the done event says it, with the numbers


def done_text(event: Mapping[str, Any]) -> str:
    """The trainer's final report: how long training took, and its final loss."""
    metrics = event.get("metrics") if isinstance(event.get("metrics"), Mapping) else {}
    took = event.get("train_seconds")
    text = "Training done" + (f" in {format_duration(float(took))}" if isinstance(took, int | float) else "")
    final = metrics.get("final_loss") if isinstance(metrics, Mapping) else None
    return text + (f": final loss {float(final):.4f}" if isinstance(final, int | float) else "")


def calibration_text(event: Mapping[str, Any]) -> str:
    """``Measured over the first 20 steps: 1.84 s a step, 5,120 tokens/s, peak 14.2 GB`` (micro-batch and all)."""
    parts = [f"{float(event['seconds_per_step']):.2f} s a step"]
    rate = event.get("tokens_per_s")
    if isinstance(rate, int | float):
        parts.append(f"{float(rate):,.0f} tokens/s")
    peak = event.get("peak_allocated_gb")
    if isinstance(peak, int | float):
        parts.append(f"peak {memory_text(float(peak))}")
    setup = f"micro-batch {event['micro_batch']} x {event['grad_accum']} accumulated, {event['seq_len']:,} tokens long"
    steps = event.get("steps") or event["step"]
    return f"Measured over the first {steps} steps ({setup}): " + ", ".join(parts)


def fit_text(event: Mapping[str, Any]) -> str:
    """``Out of memory in the first steps: trying micro-batch 1 x 4 accumulated (the same batch), ...``."""
    checkpointing = ", activation checkpointing on" if event.get("gradient_checkpointing") else ""
    return (
        f"Out of memory in the first steps: trying again with micro-batch {event['micro_batch']} x "
        f"{event['grad_accum']} accumulated{checkpointing} (the same effective batch, the same data)"
    )


def export_text(event: Mapping[str, Any]) -> str:
    """``On the machine: merging: loading the base model``."""
    return f"On the machine: {event.get('phase')}"


def exported_text(event: Mapping[str, Any]) -> str:
    """How the export on the machine ended: what it made, or why it could not."""
    if event.get("error"):
        return f"The export on the machine failed: {event['error']}"
    outputs = event.get("outputs") or {}
    names = ["the merged model" if k == "merged" else f"GGUF {str(k).removeprefix('gguf:')}" for k in outputs]
    files = len(event.get("files") or {})
    plural = "s" if files != 1 else ""
    return f"The machine made {' and '.join(names) or 'nothing'} ({files} file{plural}, each hashed for the download)"


#: How a hold ended, in words (``{step}`` is the step every GPU held at).
_HOLD_ENDS: dict[str, str] = {
    HoldOutcome.CONTINUE: "training goes on from step {step} on every GPU",
    HoldOutcome.STOP: "every GPU saves step {step} and stops",
    HoldOutcome.NO_ANSWER: "no answer came in time: every GPU saves step {step} and stops",
}


def hold_text(event: Mapping[str, Any]) -> str:
    """``Every GPU holds at step 120 while you decide``, then how (and after how long) the hold ended."""
    step = f"{int(event['step']):,}"
    if event.get("held"):
        return f"Every GPU holds at step {step} while you decide (the machine bills meanwhile)"
    ends = _HOLD_ENDS.get(str(event.get("outcome")), "the hold ended at step {step}")
    return f"Held {float(event.get('seconds') or 0.0):.0f} s: {ends.format(step=step)}"


_Words = Callable[[Mapping[str, Any]], str | None]
#: The words of each kind of event.
_EVENT_WORDS: dict[str, _Words] = {
    EventKind.STATE: state_text,
    EventKind.STEP: _step_text,
    EventKind.EVAL: lambda e: f"Eval loss {float(e['eval_loss']):.4f} at step {e['step']:,}",
    EventKind.CHECKPOINT: lambda e: (
        f"Checkpoint at step {e['step']:,} saved on the machine ({int(e['bytes']) / 1e6:,.1f} MB)"
    ),
    EventKind.DONE: done_text,
    EventKind.ERROR: _error_text,
    EventKind.CALIBRATION: calibration_text,
    EventKind.FIT: fit_text,
    EventKind.EXPORT: export_text,
    EventKind.EXPORTED: exported_text,
    EventKind.HOLD: hold_text,
}
#: The words of each phase the trainer reports.
_STATE_WORDS: dict[str, _Words] = {
    JobState.INSTALLING: _installing_text,
    JobState.DOWNLOADING: _downloading_text,
    JobState.PREPARING: _preparing_text,
    JobState.TRAINING: _training_text,
    JobState.SAVING: _saving_text,
    JobState.DONE: _done_state_text,
    JobState.FAILED: _failed_text,
}


def machine_entries(machines: Iterable[MachineMark]) -> list[LogEntry]:
    """When each rented machine started billing and when it was let go, and why."""
    entries = []
    for mark in machines:
        where = f"{mark.gpu} at {provider_word(mark.provider)}"
        entries.append(LogEntry(mark.started, f"Rented machine {mark.number}: {where} for {rate(mark.price_per_hour)}"))
        if mark.stopped is not None:
            cost = money(mark.price_per_hour * max(0.0, mark.stopped - mark.started) / 3600)
            why = f": {mark.why_stopped}" if mark.why_stopped else ""
            entries.append(LogEntry(mark.stopped, f"Machine {mark.number} let go after costing {cost}{why}"))
    return entries
