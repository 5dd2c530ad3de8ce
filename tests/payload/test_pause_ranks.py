"""A pause holds every rank: the real payload on two ranks (``accelerate launch``, DDP over gloo on this CPU).

The pause file is written as the desktop writes it; both ranks must hold at the end of the same step, train no
further while held, then go on together, and, held again, save that step and stop together.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.payload.conftest import JobFactory, events_of, start_payload
from trainer_payload.checkpoints import is_complete
from trainer_payload.protocol import (
    PAUSE_FILE_NAME,
    STOP_MARKER_NAME,
    Event,
    EventKind,
    HoldOutcome,
    JobState,
    PauseRequest,
)

pytestmark = pytest.mark.slow

#: How long the test keeps the ranks held, watching that neither trains on.
HELD_SECONDS = 3.0
#: A rank's line on the log as its hold ends.
ENDED = r"(hold ended at step \d+ after [\d.]+ s: \w+)"


def wait_for(job: Path, predicate: Callable[[Event], bool], timeout: float = 240) -> Event:
    """The first event that matches, waiting for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = next((event for event in events_of(job) if predicate(event)), None)
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError("the event never came")


def said(log: Path, pattern: str) -> dict[str, str]:
    """What each rank said on the log, by rank, for what matches ``pattern`` (the last of each rank).

    Not anchored to a line: both ranks write to one log, and a busy computer interleaves one rank's words with the
    other's progress output mid-line.
    """
    found = re.findall(rf"\brank (\d+): {pattern}", log.read_text(errors="replace"))
    return dict(found)


def until_said(log: Path, pattern: str, timeout: float = 60) -> dict[str, str]:
    """What both ranks said, once both have."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(lines := said(log, pattern)) == 2:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"not both ranks said {pattern!r}:\n{log.read_text(errors='replace')[-4000:]}")


def parse_end(words: str) -> tuple[int, float, str]:
    """(step, seconds held, outcome) of a rank's ``hold ended at step 4 after 3.0 s: continue``."""
    found = re.fullmatch(r"hold ended at step (\d+) after ([\d.]+) s: (\w+)", words)
    assert found is not None, words
    return int(found[1]), float(found[2]), found[3]


def steps(job: Path) -> list[int]:
    """The steps rank 0 reported so far."""
    return [event["step"] for event in events_of(job) if event["event"] is EventKind.STEP]


def hold_events(job: Path) -> list[Event]:
    """The ``hold`` events so far."""
    return [event for event in events_of(job) if event["event"] is EventKind.HOLD]


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kills the payload, its launcher and its ranks, if still there (the launcher has a session of its own)."""
    if process.poll() is not None:
        return
    pids, pending = [], [process.pid]
    while pending:
        pid = pending.pop()
        pids.append(pid)
        for children in Path(f"/proc/{pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                pending += [int(child) for child in children.read_text().split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def test_both_ranks_hold_at_one_step_then_go_on_together_then_save_that_step_and_stop_together(
    make_job: JobFactory, tmp_path: Path
) -> None:
    job = make_job(num_gpus=2, strategy="ddp", max_steps=100_000, checkpoint_steps=0)
    pause_file, log = job.parent / "out" / PAUSE_FILE_NAME, tmp_path / "payload.log"
    process = start_payload(job, log)
    try:
        wait_for(job, lambda e: e["event"] is EventKind.STEP and e["step"] >= 3)
        pause_file.write_text(PauseRequest(hold_seconds=120).to_text())
        first = wait_for(job, lambda e: e["event"] is EventKind.HOLD and e["held"])
        held_at = first["step"]
        both = {"0": str(held_at), "1": str(held_at)}
        assert until_said(log, r"holding at step (\d+) while the user decides") == both
        before = steps(job)  # the held step itself is logged after its end: once the ranks go on
        time.sleep(HELD_SECONDS)
        assert steps(job) == before and max(before) <= held_at, "rank 0 trained on while held"
        assert hold_events(job) == [first], "still held"

        pause_file.unlink()  # the desktop's "go on"
        went_on = wait_for(job, lambda e: e["event"] is EventKind.HOLD and not e["held"])
        assert went_on["step"] == held_at and went_on["outcome"] == HoldOutcome.CONTINUE
        assert went_on["seconds"] >= HELD_SECONDS
        for rank, words in until_said(log, ENDED).items():
            step, seconds, outcome = parse_end(words)
            assert (step, outcome) == (held_at, "continue") and seconds >= HELD_SECONDS, f"rank {rank}: {words}"
        wait_for(job, lambda e: e["event"] is EventKind.STEP and e["step"] >= held_at + 3)

        pause_file.write_text(PauseRequest(hold_seconds=120).to_text())
        second = wait_for(job, lambda e: e["event"] is EventKind.HOLD and e["held"] and e["step"] > held_at)
        pause_file.write_text(PauseRequest(hold_seconds=120, stop=True).to_text())  # the desktop's "stop"
        process.wait(timeout=90)
    finally:
        kill_tree(process)
    stopped_at = second["step"]
    ends = {rank: parse_end(words) for rank, words in said(log, ENDED).items()}
    assert {rank: (step, outcome) for rank, (step, _, outcome) in ends.items()} == {
        "0": (stopped_at, "stop"),
        "1": (stopped_at, "stop"),
    }
    events = events_of(job)
    checkpoint = next(e for e in events if e["event"] is EventKind.CHECKPOINT)
    assert checkpoint["step"] == stopped_at and max(steps(job)) == stopped_at, "saved the step they held at"
    folder = job.parent / "out" / checkpoint["path"]
    assert is_complete(folder) and {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in folder.iterdir()}
    final = events[-1]
    assert final["event"] is EventKind.STATE and final["state"] == JobState.FAILED
    assert final["stopped_by"] == "signal" and final["checkpoint_step"] == stopped_at


def test_a_hold_nobody_answers_saves_and_stops_and_lets_the_machine_stop_itself(
    make_job: JobFactory, tmp_path: Path
) -> None:
    """The desktop that asked is gone: past the hold's limit the trainer (one GPU here) saves the step it held at,
    stops as a stop would, and leaves the stop marker, so the machine's self-stop can end the billing."""
    job = make_job(max_steps=100_000, checkpoint_steps=0)
    out = job.parent / "out"
    process = start_payload(job, tmp_path / "payload.log")
    try:
        wait_for(job, lambda e: e["event"] is EventKind.STEP and e["step"] >= 3)
        assert not (out / STOP_MARKER_NAME).exists()
        (out / PAUSE_FILE_NAME).write_text(PauseRequest(hold_seconds=2).to_text())
        assert process.wait(timeout=90) == 143
    finally:
        kill_tree(process)
    events = events_of(job)
    held, ended = hold_events(job)
    assert ended["outcome"] == HoldOutcome.NO_ANSWER and ended["step"] == held["step"] and ended["seconds"] >= 2
    checkpoint = next(e for e in events if e["event"] is EventKind.CHECKPOINT)
    assert checkpoint["step"] == held["step"] and is_complete(out / checkpoint["path"])
    final = events[-1]
    assert final["stopped_by"] == "signal" and final["checkpoint_step"] == held["step"]
    assert str(final["reason"]).startswith("stopped: nobody answered in ")
    assert (out / STOP_MARKER_NAME).exists(), "the machine may stop itself: nobody may be coming"
