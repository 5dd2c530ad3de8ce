"""A pause holds every rank: the agreement in :func:`trainer_payload.pause.hold`, in process with an injected clock.

The ranks are threads whose all-reduce is a real rendezvous (each waits for every other, then all take the largest of
each flag), as gloo's and NCCL's are; the real two-rank run of the payload is in test_pause_ranks.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from trainer_payload import pause
from trainer_payload.pause import Hold, PauseWatch, hold
from trainer_payload.protocol import (
    DEFAULT_HOLD_SECONDS,
    MAX_HOLD_SECONDS,
    PAUSE_FILE_NAME,
    HoldOutcome,
    PauseRequest,
    read_pause_request,
)


class Flags:
    """A rank's stop flags, as ``trainer_payload.train.Stop`` keeps them."""

    def __init__(self) -> None:
        self.terminated = False
        self.last_activity = 0.0


class Beats:
    """An injected clock whose sleep is one heartbeat, calling ``at_beat`` with the beat's number first."""

    def __init__(self, at_beat: Callable[[int], None] = lambda _n: None) -> None:
        self.now, self.count, self.at_beat = 0.0, 0, at_beat

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.count += 1
        self.now += seconds
        self.at_beat(self.count)


def alone(flags: tuple[bool, ...]) -> tuple[bool, ...]:
    """The agreement of a run on one GPU: its own flags."""
    return flags


def held_alone(path: Path, at_beat: Callable[[int], None], stop: Flags | None = None) -> tuple[Hold, int]:
    """Holds one rank that reads ``path``; how it ended and at which beat."""
    beats = Beats(at_beat)
    ended = hold(PauseWatch(path), alone, stop or Flags(), clock=beats.clock, sleep=beats.sleep)
    return ended, beats.count


def test_the_file_deleted_lets_the_rank_go_on_at_the_next_beat(tmp_path: Path) -> None:
    path = tmp_path / PAUSE_FILE_NAME
    path.write_text(PauseRequest(hold_seconds=60).to_text())
    ended, beat = held_alone(path, lambda n: path.unlink() if n == 5 else None)
    assert (ended.outcome, beat, ended.seconds) == (HoldOutcome.CONTINUE, 5, 5 * pause.HEARTBEAT_SECONDS)


def test_a_stop_answer_or_a_sigterm_saves_and_stops(tmp_path: Path) -> None:
    path = tmp_path / PAUSE_FILE_NAME
    path.write_text(PauseRequest(hold_seconds=60).to_text())
    answer = PauseRequest(hold_seconds=60, stop=True).to_text()
    ended, beat = held_alone(path, lambda n: path.write_text(answer) if n == 3 else None)
    assert (ended.outcome, beat) == (HoldOutcome.STOP, 3)
    path.write_text(PauseRequest(hold_seconds=60).to_text())
    stop = Flags()
    ended, beat = held_alone(path, lambda n: setattr(stop, "terminated", n == 4), stop)
    assert (ended.outcome, beat) == (HoldOutcome.STOP, 4)
    assert stop.last_activity > 0, "held on purpose: the idle watchdog sees activity"


def test_no_answer_within_the_limit_stops_as_a_stop_would(tmp_path: Path) -> None:
    path = tmp_path / PAUSE_FILE_NAME
    path.write_text(PauseRequest(hold_seconds=10).to_text())
    ended, beat = held_alone(path, lambda _n: None)
    assert ended.outcome is HoldOutcome.NO_ANSWER and beat == 11, "held its 10 s, not a beat less"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"hold_seconds": 30, "stop": true}', PauseRequest(30.0, stop=True)),
        ('{"hold_seconds": 1e300}', PauseRequest(MAX_HOLD_SECONDS)),
        ('{"hold_seconds": -5, "stop": "yes"}', PauseRequest(0.0)),
        ('{"hold_seconds": true}', PauseRequest(DEFAULT_HOLD_SECONDS)),
        ('{"hold_seconds": NaN}', PauseRequest(DEFAULT_HOLD_SECONDS)),
        ('{"hold_sec', PauseRequest(DEFAULT_HOLD_SECONDS)),
        ("[1]", PauseRequest(DEFAULT_HOLD_SECONDS)),
    ],
)
def test_a_pause_file_is_read_safely_and_a_damaged_one_still_holds_within_a_limit(
    tmp_path: Path, text: str, expected: PauseRequest
) -> None:
    path = tmp_path / PAUSE_FILE_NAME
    path.write_text(text)
    assert read_pause_request(path) == expected
    assert PauseRequest.parse(expected.to_text()) == expected


def test_no_file_is_no_hold_and_a_rank_that_reads_none_never_asks(tmp_path: Path) -> None:
    path = tmp_path / PAUSE_FILE_NAME
    assert read_pause_request(path) is None and not PauseWatch(path).asked()
    path.write_text(PauseRequest().to_text())
    assert PauseWatch(path).asked() and not PauseWatch(None).asked()


class AllReduceMax:
    """A collective of ``ranks`` threads: each call waits for every rank's flags, then all get the largest of each."""

    def __init__(self, ranks: int) -> None:
        self.barrier = threading.Barrier(ranks, timeout=10)
        self.given: list[tuple[bool, ...]] = [() for _ in range(ranks)]

    def of(self, rank: int) -> Callable[[tuple[bool, ...]], tuple[bool, ...]]:
        """Rank ``rank``'s side of the all-reduce."""

        def agree(flags: tuple[bool, ...]) -> tuple[bool, ...]:
            self.given[rank] = flags
            self.barrier.wait()
            agreed = tuple(any(column) for column in zip(*self.given, strict=True))
            self.barrier.wait()  # nobody writes the next beat's flags before all have read this one's
            return agreed

        return agree


def two_ranks_held(path: Path, act: Callable[[int, int, Flags], None]) -> list[tuple[Hold, int]]:
    """Holds two ranks (rank 0 reads ``path``, rank 1 none); ``act(rank, beat, its flags)`` runs on every beat."""
    collective, stops = AllReduceMax(2), [Flags(), Flags()]
    results: list[tuple[Hold, int]] = [(Hold(HoldOutcome.CONTINUE, -1), -1)] * 2

    def rank(number: int) -> None:
        beats = Beats(lambda n: act(number, n, stops[number]))
        watch = PauseWatch(path if number == 0 else None)
        ended = hold(watch, collective.of(number), stops[number], clock=beats.clock, sleep=beats.sleep)
        results[number] = (ended, beats.count)

    threads = [threading.Thread(target=rank, args=(number,)) for number in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    return results


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [("delete", HoldOutcome.CONTINUE), ("stop", HoldOutcome.STOP), ("sigterm on rank 1", HoldOutcome.STOP)],
)
def test_two_ranks_leave_the_hold_in_the_same_beat_with_the_same_outcome(
    tmp_path: Path, answer: str, outcome: HoldOutcome
) -> None:
    """Rank 1 reads no file and rank 0 gets no SIGTERM: each learns the other's news from the all-reduce alone."""
    path = tmp_path / PAUSE_FILE_NAME
    path.write_text(PauseRequest(hold_seconds=60).to_text())

    def act(rank: int, beat: int, stop: Flags) -> None:
        if beat != 4:
            return
        if rank == 0 and answer == "delete":
            path.unlink()
        elif rank == 0 and answer == "stop":
            path.write_text(PauseRequest(hold_seconds=60, stop=True).to_text())
        elif rank == 1 and answer == "sigterm on rank 1":
            stop.terminated = True

    results = two_ranks_held(path, act)
    assert [(ended.outcome, beat) for ended, beat in results] == [(outcome, 4), (outcome, 4)]
