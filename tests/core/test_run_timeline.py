"""A run's timeline (phases, machines, phases to come) and what RunProgress keeps for the monitor's log and cards."""

from __future__ import annotations

from typing import Any

import pytest

from desktop.core.runs.progress import PhaseSpan, RunProgress, StopInfo, stored_estimate
from desktop.core.runs.timeline import MachineMark, run_timeline, upcoming_states


def transitions(*rows: tuple[float, str]) -> list[dict[str, Any]]:
    return [{"ts": ts, "to_state": state, "from_state": None, "note": ""} for ts, state in rows]


def event(seq: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"ts": float(seq), "seq": seq, "event": kind, **fields}


def step(seq: int, number: int, loss: float = 1.0) -> dict[str, Any]:
    return event(seq, "step", step=number, total_steps=10, loss=loss)


@pytest.mark.parametrize(
    ("states", "ahead"),
    [
        ([], ["connecting", "uploading", "bootstrapping", "training", "syncing", "pulling", "finished"]),
        (["planned", "connecting", "uploading"], ["bootstrapping", "training", "syncing", "pulling", "finished"]),
        (["planned", "connecting", "uploading", "bootstrapping", "training"], ["syncing", "pulling", "finished"]),
        (
            ["planned", "connecting", "uploading", "bootstrapping", "training", "paused"],
            ["connecting", "training", "syncing", "pulling", "finished"],
        ),
        (
            ["planned", "connecting", "paused"],
            ["connecting", "uploading", "bootstrapping", "training", "syncing", "pulling", "finished"],
        ),
        (["planned", "connecting", "uploading", "bootstrapping", "training", "syncing", "pulling", "finished"], []),
        (["planned", "connecting", "uploading", "bootstrapping", "training", "cancelled"], []),
        (["planned", "connecting", "failed"], []),
    ],
)
def test_the_phases_still_to_come(states: list[str], ahead: list[str]) -> None:
    history = transitions(*((float(i), state) for i, state in enumerate(states)))
    assert [state.value for state in upcoming_states(history)] == ahead


def test_the_timeline_puts_each_machine_before_its_first_phase_and_the_phases_to_come_last() -> None:
    history = transitions(
        (0, "planned"), (30, "connecting"), (40, "training"), (100, "paused"), (130, "connecting"), (140, "training")
    )
    first = MachineMark(1, "runpod", "RTX 4090", 0.34, 2.0, 105.0, "a spot machine outbid")
    second = MachineMark(2, "vast", "RTX 4090", 0.41, 120.0, None)
    items = run_timeline(history, now=200.0, machines=[second, first])
    kinds = [item.state.value if isinstance(item, PhaseSpan) else f"machine {item.number}" for item in items]
    assert kinds == [
        "planned",
        "machine 1",
        "connecting",
        "training",
        "paused",
        "machine 2",
        "connecting",
        "training",
        "syncing",
        "pulling",
        "finished",
    ]
    spans = [item for item in items if isinstance(item, PhaseSpan)]
    assert [span.seconds for span in spans[:6]] == [30.0, 10.0, 60.0, 30.0, 10.0, 60.0], "durations from history"
    assert spans[5].current and not spans[5].upcoming
    assert all(span.upcoming and not span.current for span in spans[6:])


def test_a_resumed_session_replaces_the_points_it_trains_again_and_starts_its_step_rate_afresh() -> None:
    progress = RunProgress()
    progress.apply_all([event(1, "state", state="training"), *(step(2 + i, i + 1) for i in range(6))])
    progress.apply(event(8, "eval", step=5, eval_loss=2.0))
    progress.apply(event(9, "state", state="training", resume_from="checkpoint-4"))
    assert progress.resume_from == "checkpoint-4"
    assert progress.steps_per_second is None, "the gap between two machines is no step rate"
    progress.apply_all([step(10, 5, loss=0.5), event(11, "eval", step=5, eval_loss=1.0)])
    assert progress.loss_steps == [1, 2, 3, 4, 5] and progress.losses[-1] == 0.5
    assert (progress.eval_steps, progress.eval_losses) == ([5], [1.0])


def test_a_stop_says_which_checkpoint_it_kept_from_its_field_or_from_older_files() -> None:
    progress = RunProgress()
    progress.apply(event(1, "checkpoint", step=20, path="checkpoints/checkpoint-20", bytes=1, sha256={}))
    progress.apply(event(2, "state", state="failed", reason="stopped", stopped_by="signal", checkpoint_step=25))
    assert progress.stopped == StopInfo("signal", 25, 2.0)
    older = RunProgress()  # written before the field existed: the newest checkpoint stands in
    older.apply(event(1, "checkpoint", step=20, path="checkpoints/checkpoint-20", bytes=1, sha256={}))
    older.apply(event(2, "state", state="failed", reason="stopped by SIGTERM", stopped_by="signal"))
    assert older.stopped == StopInfo("signal", 20, 2.0)
    older.apply(event(3, "state", state="training", resume_from="checkpoint-20"))
    assert older.stopped is None, "training again: the stop is over"
    failed = RunProgress()
    failed.apply(event(1, "state", state="failed", reason="oom"))
    assert failed.stopped is None, "a failure is no stop"


def test_the_log_keeps_milestones_not_every_step_or_download_reading() -> None:
    progress = RunProgress()
    progress.apply_all(
        [
            event(1, "state", state="installing", step="check", python="3.11", detail="ready"),
            event(2, "state", state="downloading", model="m", bytes_done=5, bytes_total=10),
            event(3, "state", state="training"),
            *(step(4 + i, i + 1) for i in range(5)),
            event(9, "checkpoint", step=5, path="checkpoints/checkpoint-5", bytes=1, sha256={}),
        ]
    )
    assert [(m["seq"], m["event"]) for m in progress.milestones] == [
        (1, "state"),
        (3, "state"),
        (4, "step"),
        (9, "checkpoint"),
    ]
    assert progress.gpus == [], "the machine was looked at and had no NVIDIA driver"
    assert progress.download_bytes == (5.0, 10.0)
    with_gpu = RunProgress()
    assert with_gpu.gpus is None, "not looked at yet"
    with_gpu.apply(event(1, "state", state="installing", step="check", gpus=["NVIDIA A100, 550, 81920 MiB"]))
    assert with_gpu.gpus == ["NVIDIA A100, 550, 81920 MiB"]


def test_the_stored_estimate_is_the_runs_prediction_priced_at_its_rate_where_it_has_no_dollars() -> None:
    rented = {"predicted": {"gpu": "RTX 4090", "hours": 0.5, "usd": 0.2, "tokens_per_s": 5000.0}}
    estimate = stored_estimate(rented)
    assert estimate is not None and (estimate.hours, estimate.usd, estimate.gpu) == (0.5, 0.2, "RTX 4090")
    own = stored_estimate({"predicted": {"hours": 2.0}, "hourly_rate_usd": 1.5})
    assert own is not None and own.usd == 3.0
    assert stored_estimate({"predicted": {"hours": 2.0}}) is not None
    assert stored_estimate({}) is None and stored_estimate({"predicted": {"hours": "soon"}}) is None
