"""A run's progress as the app shows it, built from the payload's events and the run's state history (pure).

:class:`RunProgress` takes the events of ``events.jsonl`` one at a time (:meth:`RunProgress.apply`), so a monitor
that tails the file keeps it current without reading the file again. :func:`phase_durations` and
:func:`cost_so_far` read the transitions the run store records (dicts with ``ts``, ``from_state``, ``to_state``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from desktop.core.runs.states import TERMINAL, RunState
from trainer_payload.protocol import JobState

#: Step events used for the step rate behind the ETA (the most recent ones).
RATE_WINDOW = 20
#: Events kept for the run's log (the oldest go first; the chart keeps every loss).
MILESTONES = 400
#: Entering one of these states starts the bill (the machine is being rented or reached).
BILLING_STARTS = frozenset({RunState.PROVISIONING, RunState.CONNECTING})
#: States after which a run goes no further on its own (a failed run may still be resumed by the user).
ENDED = frozenset({*TERMINAL, RunState.FAILED})
#: Entering one of these states ends the bill (the machine is released, lost or done with).
BILLING_ENDS = frozenset({*ENDED, RunState.PAUSED})


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint the trainer sealed: its step, its path under the job's output folder and its size."""

    step: int
    path: str
    bytes: int


@dataclass(frozen=True)
class ErrorInfo:
    """An error the trainer reported: its kind (oom, data, …), what happened and what to do."""

    kind: str
    message: str
    hint: str


@dataclass(frozen=True)
class StopInfo:
    """The trainer stopped on request (a user's stop, a budget, the machine going away) rather than failing.

    Attributes:
        cause: What stopped it, as the trainer saw it (a :class:`~trainer_payload.protocol.StopCause` value).
        checkpoint_step: The step of the checkpoint it saved on the way out (None when it saved none).
        ts: When it stopped (epoch seconds).
    """

    cause: str
    checkpoint_step: int | None
    ts: float | None


@dataclass(frozen=True)
class RewardPoint:
    """A preference objective's rewards at one step (DPO, ORPO), over that step's pairs or the held-out ones.

    Attributes:
        step: The step.
        accuracy: Share of pairs whose chosen answer got the higher reward (0 to 1).
        margin: Mean reward of chosen minus rejected.
        chosen: Mean reward of the chosen answers (None where the trainer did not log it).
        rejected: Mean reward of the rejected answers.
    """

    step: int
    accuracy: float
    margin: float | None
    chosen: float | None
    rejected: float | None


def reward_point(step: int, event: Mapping[str, Any]) -> RewardPoint | None:
    """The rewards a step or eval event carries, None for an objective without them (SFT, CPT)."""
    accuracy = _number(event.get("reward_accuracy"))
    if accuracy is None:
        return None
    fields = ("reward_margin", "reward_chosen", "reward_rejected")
    return RewardPoint(step, accuracy, *(_number(event.get(name)) for name in fields))


@dataclass(frozen=True)
class DoneInfo:
    """The trainer's final report: where the adapter is (under the output folder), metrics and timings."""

    adapter_path: str
    metrics: dict[str, Any]
    wall_seconds: float | None
    train_seconds: float | None


@dataclass
class RunProgress:
    """Everything the monitor shows about training, updated event by event.

    Attributes:
        loss_steps: Steps of the training-loss points (parallel to ``losses``).
        losses: Training loss at each of ``loss_steps``.
        eval_steps: Steps of the eval-loss points (parallel to ``eval_losses``).
        eval_losses: Eval loss at each of ``eval_steps``.
        rewards: A preference objective's rewards at each step that logged them (empty for SFT and CPT).
        eval_rewards: Its rewards on the held-out pairs at each evaluation.
        job_state: The trainer's latest phase (installing, downloading, preparing, training, saving, done, failed).
        step: The latest step reported.
        total_steps: Steps the trainer will run in all (0 until known).
        epoch: The latest epoch (fractional).
        learning_rate: The latest learning rate.
        tokens_per_s: The latest training throughput.
        tokens: Tokens trained on so far.
        gpu_mem_allocated_gb: Peak allocated GPU memory (GB), None on a CPU or before the first step.
        gpu_mem_reserved_gb: Peak reserved GPU memory (GB).
        gpu_util: GPU utilisation in percent, None where the driver does not say.
        checkpoints: Checkpoints sealed so far, oldest first.
        errors: Errors reported so far, oldest first.
        done: The final report, once training finished.
        stopped: How the trainer last stopped on request (cleared when it trains again), None when it did not.
        gpus: The machine's GPUs as its driver names them (from the bootstrap's look at the machine): None before
            it looked, empty when it found none.
        download_bytes: Bytes of the model downloaded so far and the total (None when the Hub does not say), while
            the machine downloads it.
        resume_from: The checkpoint the latest training session continued from.
        milestones: The events worth a line in the run's log (phases, evals, checkpoints, errors, the first step of
            each training session, the end), oldest first, at most :data:`MILESTONES`.
        bill_events: The events that say what a billing machine did besides the run's state (holds for the user's
            answer, the export on the machine), oldest first: the bill's split by phase reads them.
        last_seq: Sequence number of the last event applied (older or repeated events are ignored).
        last_ts: Time of the last event applied (epoch seconds).
    """

    loss_steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    rewards: list[RewardPoint] = field(default_factory=list)
    eval_rewards: list[RewardPoint] = field(default_factory=list)
    job_state: str | None = None
    step: int = 0
    total_steps: int = 0
    epoch: float = 0.0
    learning_rate: float | None = None
    tokens_per_s: float | None = None
    tokens: float | None = None
    gpu_mem_allocated_gb: float | None = None
    gpu_mem_reserved_gb: float | None = None
    gpu_util: float | None = None
    checkpoints: list[CheckpointInfo] = field(default_factory=list)
    errors: list[ErrorInfo] = field(default_factory=list)
    done: DoneInfo | None = None
    stopped: StopInfo | None = None
    gpus: list[str] | None = None
    download_bytes: tuple[float, float | None] | None = None
    resume_from: str | None = None
    milestones: deque[Mapping[str, Any]] = field(default_factory=lambda: deque(maxlen=MILESTONES))
    bill_events: list[Mapping[str, Any]] = field(default_factory=list)
    last_seq: int = 0
    last_ts: float | None = None
    _recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW), repr=False)
    _first_step_due: bool = field(default=False, repr=False)

    def apply_all(self, events: Sequence[Mapping[str, Any]]) -> bool:
        """Applies events in order; returns whether any of them was new."""
        changed = False
        for event in events:
            changed = self.apply(event) or changed
        return changed

    def apply(self, event: Mapping[str, Any]) -> bool:
        """Applies one event; returns False when it was already applied (its ``seq`` is not newer) or is malformed.

        A malformed event (a field of the wrong type) is skipped, so one bad line never stops the monitor.
        """
        try:
            seq = int(event.get("seq", 0) or 0)
        except (TypeError, ValueError):
            return False
        if seq and seq <= self.last_seq:
            return False
        self.last_seq = seq or self.last_seq
        self.last_ts = _number(event.get("ts")) or self.last_ts
        kind = str(event.get("event"))
        if kind in _KINDS:
            try:
                getattr(self, f"_on_{kind}")(event)
            except (TypeError, ValueError):
                return False
        return True

    def _on_state(self, event: Mapping[str, Any]) -> None:
        state = str(event.get("state"))
        self.job_state = state
        gpus = event.get("gpus")
        if isinstance(gpus, list):
            self.gpus = [str(gpu) for gpu in gpus]
        elif event.get("step") == "check":  # the bootstrap looked at the machine and found no NVIDIA driver
            self.gpus = []
        done = _number(event.get("bytes_done"))
        if done is not None:  # a download's progress: shown as it goes, no line in the log
            self.download_bytes = (done, _number(event.get("bytes_total")))
            return
        if state == JobState.TRAINING:  # a new session (a resume): its step rate starts afresh
            self.stopped, self._first_step_due = None, True
            self._recent.clear()
            self.resume_from = str(event["resume_from"]) if event.get("resume_from") else None
        elif state == JobState.FAILED and event.get("stopped_by"):
            self._on_stopped(event)
        self.milestones.append(event)

    def _on_stopped(self, event: Mapping[str, Any]) -> None:
        step = event.get("checkpoint_step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = self.checkpoints[-1].step if self.checkpoints else None  # files written before the field existed
        self.stopped = StopInfo(str(event.get("stopped_by")), step, _number(event.get("ts")))

    def _on_step(self, event: Mapping[str, Any]) -> None:
        self.step = int(event.get("step", self.step))
        self.total_steps = int(event.get("total_steps") or self.total_steps)
        self.epoch = _number(event.get("epoch")) or self.epoch
        self.learning_rate = _number(event.get("lr"))
        loss = _number(event.get("loss"))
        if loss is not None:
            _drop_from(self.step, self.loss_steps, self.losses)  # a resumed run retrained these steps
            self.loss_steps.append(self.step)
            self.losses.append(loss)
        _add_reward(self.rewards, reward_point(self.step, event))
        rate = _number(event.get("tokens_per_s"))
        self.tokens_per_s = rate if rate is not None else self.tokens_per_s
        self.tokens = _number(event.get("tokens")) or self.tokens
        for name in ("gpu_mem_allocated_gb", "gpu_mem_reserved_gb", "gpu_util"):
            if name in event:
                setattr(self, name, _number(event.get(name)))
        if self.last_ts is not None:
            self._recent.append((self.last_ts, self.step))
        if self._first_step_due:
            self._first_step_due = False
            self.milestones.append(event)

    def _on_eval(self, event: Mapping[str, Any]) -> None:
        loss = _number(event.get("eval_loss"))
        if loss is not None:
            step = int(event.get("step", self.step))
            _drop_from(step, self.eval_steps, self.eval_losses)
            self.eval_steps.append(step)
            self.eval_losses.append(loss)
            _add_reward(self.eval_rewards, reward_point(step, event))
            self.milestones.append(event)

    def _on_checkpoint(self, event: Mapping[str, Any]) -> None:
        self.checkpoints.append(
            CheckpointInfo(int(event.get("step", 0)), str(event.get("path", "")), int(event.get("bytes", 0) or 0))
        )
        self.milestones.append(event)

    def _on_done(self, event: Mapping[str, Any]) -> None:
        metrics = event.get("metrics")
        self.done = DoneInfo(
            str(event.get("adapter_path", "")),
            dict(metrics) if isinstance(metrics, Mapping) else {},
            _number(event.get("wall_seconds")),
            _number(event.get("train_seconds")),
        )
        self.milestones.append(event)

    def _on_error(self, event: Mapping[str, Any]) -> None:
        self.errors.append(
            ErrorInfo(str(event.get("kind", "internal")), str(event.get("message", "")), str(event.get("hint", "")))
        )
        self.milestones.append(event)

    def _on_calibration(self, event: Mapping[str, Any]) -> None:
        self.milestones.append(event)  # the first steps measured: a line in the log, the estimate made again

    def _on_fit(self, event: Mapping[str, Any]) -> None:
        self.milestones.append(event)  # a smaller micro-batch after an out-of-memory: a line in the log

    def _on_export(self, event: Mapping[str, Any]) -> None:
        self.milestones.append(event)  # the export on the machine, phase by phase
        self.bill_events.append(event)

    def _on_exported(self, event: Mapping[str, Any]) -> None:
        self.milestones.append(event)
        self.bill_events.append(event)

    def _on_hold(self, event: Mapping[str, Any]) -> None:
        self.bill_events.append(event)  # waiting for the user's answer to an overrun: paid idle time

    @property
    def steps_per_second(self) -> float | None:
        """The step rate over the recent step events, None until two steps at different times are known."""
        if len(self._recent) < 2:
            return None
        (first_ts, first_step), (last_ts, last_step) = self._recent[0], self._recent[-1]
        if last_ts <= first_ts or last_step <= first_step:
            return None
        return (last_step - first_step) / (last_ts - first_ts)

    @property
    def eta_seconds(self) -> float | None:
        """Seconds of training left at the recent step rate (from the last step event); None when unknown."""
        rate = self.steps_per_second
        if rate is None or self.total_steps <= 0 or self.done is not None:
            return None
        return max(0, self.total_steps - self.step) / rate


_KINDS = frozenset(
    {"state", "step", "eval", "checkpoint", "done", "error", "calibration", "fit", "export", "exported", "hold"}
)


def _drop_from(step: int, steps: list[int], values: list[float]) -> None:
    """Drops the points at ``step`` and after: a resumed session trains them again, and its points count."""
    if steps and steps[-1] >= step:
        keep = next((i for i in range(len(steps) - 1, -1, -1) if steps[i] < step), -1) + 1
        del steps[keep:], values[keep:]


def _add_reward(points: list[RewardPoint], point: RewardPoint | None) -> None:
    """Appends ``point``, first dropping the points at its step and after (a resumed session retrains them)."""
    if point is None:
        return
    while points and points[-1].step >= point.step:
        points.pop()
    points.append(point)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass(frozen=True)
class PhaseSpan:
    """One stretch of a run's history in one state.

    Attributes:
        state: The state the run was in.
        started: When it entered it (epoch seconds).
        seconds: How long it stayed (until the next transition, or until ``now`` for the current state).
        current: Whether the run is still in it.
        upcoming: A phase still to come (``started`` and ``seconds`` mean nothing yet).
    """

    state: RunState
    started: float
    seconds: float
    current: bool
    upcoming: bool = False


def phase_durations(transitions: Sequence[Mapping[str, Any]], now: float) -> list[PhaseSpan]:
    """The run's states in order with how long each lasted; a last state that ended the run lasts 0 s.

    Args:
        transitions: The run store's transitions, oldest first (``ts`` and ``to_state`` are used).
        now: The current time (epoch seconds), which ends the current state.
    """
    spans = []
    for index, row in enumerate(transitions):
        state, started = RunState(row["to_state"]), float(row["ts"])
        last = index == len(transitions) - 1
        end = now if last else float(transitions[index + 1]["ts"])
        seconds = 0.0 if last and state in ENDED else max(0.0, end - started)
        spans.append(PhaseSpan(state, started, seconds, current=last))
    return spans


def billable_seconds(transitions: Sequence[Mapping[str, Any]], now: float) -> float:
    """Seconds a machine was billing: from entering provisioning/connecting until paused, failed or ended.

    A resumed run bills again from its next connection; a run still live bills until ``now``.
    """
    total, since = 0.0, None
    for row in transitions:
        state, ts = RunState(row["to_state"]), float(row["ts"])
        if since is None and state in BILLING_STARTS:
            since = ts
        elif since is not None and state in BILLING_ENDS:
            total, since = total + max(0.0, ts - since), None
    if since is not None:
        total += max(0.0, now - since)
    return total


def billing_now(transitions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the run's machine is billing after these transitions: billing started and has not ended since."""
    since = None
    for row in transitions:
        state = RunState(row["to_state"])
        if since is None and state in BILLING_STARTS:
            since = state
        elif since is not None and state in BILLING_ENDS:
            since = None
    return since is not None


def cost_so_far(hourly_rate: float | None, transitions: Sequence[Mapping[str, Any]], now: float) -> float:
    """Dollars spent so far at ``hourly_rate`` (0 when no rate is set) over the billable time."""
    if not hourly_rate or hourly_rate <= 0:
        return 0.0
    return hourly_rate * billable_seconds(transitions, now) / 3600


def run_duration(transitions: Sequence[Mapping[str, Any]], now: float) -> float:
    """Seconds from the run's creation to its end (its last transition when it ended, else ``now``)."""
    if not transitions:
        return 0.0
    first, last = float(transitions[0]["ts"]), transitions[-1]
    end = float(last["ts"]) if RunState(last["to_state"]) in ENDED else now
    return max(0.0, end - first)


def format_duration(seconds: float | None) -> str:
    """A duration for people: ``42 s``, ``3 min 05 s``, ``2 h 07 min``; an em dash when unknown."""
    if seconds is None:
        return "—"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@dataclass(frozen=True)
class Estimate:
    """What the run was expected to take and cost before it started (the run's stored prediction).

    Attributes:
        hours: Hours of training expected.
        usd: Dollars expected (hours times the machine's rate), None when no rate is known.
        gpu: The GPU the prediction was made for (None when it does not say).
        tokens_per_s: The training speed expected (None when it does not say).
    """

    hours: float
    usd: float | None
    gpu: str | None = None
    tokens_per_s: float | None = None


def stored_estimate(spec: Mapping[str, Any]) -> Estimate | None:
    """The run's stored prediction (``predicted`` in its spec: sizing's for the GPU it got), None without one.

    A prediction without dollars (a run on the user's own server) is priced at the run's stated hourly rate.
    """
    predicted = spec.get("predicted")
    if not isinstance(predicted, Mapping):
        return None
    hours = _number(predicted.get("hours"))
    if hours is None or hours < 0:
        return None
    usd = _number(predicted.get("usd"))
    rate = _number(spec.get("hourly_rate_usd"))
    if usd is None and rate:
        usd = hours * rate
    gpu = predicted.get("gpu")
    return Estimate(hours, usd, str(gpu) if gpu else None, _number(predicted.get("tokens_per_s")))
