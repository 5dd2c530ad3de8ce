"""Background operations on a real Qt loop: newest wins, progress on the UI thread, cancel, failures, deletion."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

import pytest
import shiboken6
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from desktop.ui.background import CoroutineOperation, Job, Operation, cancel_group

WAIT = 10.0


@pytest.fixture
def widget(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> QWidget:
    page = QWidget()
    qtbot.addWidget(page)
    return page


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException]]:
    """What reaches the app's error reporter."""
    errors: list[BaseException] = []

    def hook(_kind: type[BaseException], error: BaseException, _trace: TracebackType | None) -> None:
        errors.append(error)

    monkeypatch.setattr("sys.excepthook", hook)
    yield errors


def gated(gate: threading.Event, value: str) -> Callable[[Job], str]:
    """Work that waits for ``gate`` (or its cancel) and returns ``value``."""

    def work(job: Job) -> str:
        while not gate.wait(0.01):
            if job.cancelled:
                return "cancelled"
        return value

    return work


def test_newest_wins_in_a_group(widget: QWidget, qloop: asyncio.AbstractEventLoop) -> None:
    shown: list[str] = []
    first_gate, second_gate = threading.Event(), threading.Event()
    first = Operation(widget, gated(first_gate, "old"), shown.append, group="g").run()
    second = Operation(widget, gated(second_gate, "new"), shown.append, group="g").run()
    other = Operation(widget, gated(second_gate, "other group"), shown.append, group="h").run()
    assert first.job.cancelled and not second.job.cancelled and not other.job.cancelled
    first_gate.set()
    second_gate.set()
    qloop.run_until_complete(asyncio.wait_for(asyncio.gather(first.wait(), second.wait(), other.wait()), WAIT))
    assert first.task.cancelled() and sorted(shown) == ["new", "other group"]


def test_progress_arrives_on_the_ui_thread_before_the_result(widget: QWidget, qloop: asyncio.AbstractEventLoop) -> None:
    events: list[tuple[str, object, bool]] = []

    def work(job: Job) -> int:
        for fraction in (0.25, 0.5, 1.0):
            job.report(fraction)
        return 3

    def on_progress(value: float) -> None:
        events.append(("progress", value, threading.current_thread() is threading.main_thread()))

    def on_success(value: int) -> None:
        events.append(("success", value, threading.current_thread() is threading.main_thread()))

    running = Operation(widget, work, on_success).with_progress(on_progress).run()
    qloop.run_until_complete(asyncio.wait_for(running.wait(), WAIT))
    qloop.run_until_complete(asyncio.sleep(0.05))  # progress posted from the worker is delivered in order
    assert events[-1] == ("success", 3, True)
    assert [value for _kind, value, _main in events[:-1]] == [0.25, 0.5, 1.0]
    assert all(main for _kind, _value, main in events)


def test_cancel_stops_the_work_and_no_success_fires(
    widget: QWidget, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    started, stopped = threading.Event(), threading.Event()
    shown: list[str] = []

    def work(job: Job) -> str:
        started.set()
        while not job.cancelled:
            job.report(0.5)
            job.cancel.wait(0.01)
        stopped.set()
        return "finished anyway"

    progress: list[float] = []
    running = Operation(widget, work, shown.append, group="g").with_progress(progress.append).run()
    wait_for(started.is_set, WAIT)
    cancel_group(widget, "g")
    assert stopped.wait(WAIT), "the work saw its cancel flag and stopped"
    wait_for(lambda: not running.active, WAIT)
    qloop.run_until_complete(asyncio.sleep(0.05))
    count = len(progress)
    qloop.run_until_complete(asyncio.sleep(0.05))
    assert running.task.cancelled() and shown == [] and len(progress) == count


def test_a_failure_goes_to_its_handler_and_an_unhandled_one_to_the_error_reporter(
    widget: QWidget, qloop: asyncio.AbstractEventLoop, reported: list[BaseException]
) -> None:
    def broken(_job: Job) -> str:
        raise ValueError("bad row")

    def crashed(_job: Job) -> str:
        raise RuntimeError("bug")

    shown: list[str] = []
    failed: list[Exception] = []
    handled = Operation(widget, broken, shown.append).failure(failed.append, ValueError).run()
    unhandled = Operation(widget, crashed, shown.append).failure(failed.append, ValueError).run()
    qloop.run_until_complete(asyncio.wait_for(asyncio.gather(handled.wait(), unhandled.wait()), WAIT))
    assert shown == []
    assert [str(error) for error in failed] == ["bad row"]
    assert [str(error) for error in reported] == ["bug"]


def test_a_handler_that_raises_reports_to_the_error_reporter(
    widget: QWidget, qloop: asyncio.AbstractEventLoop, reported: list[BaseException]
) -> None:
    def broken(_job: Job) -> str:
        raise OSError("disk gone")

    def show_then_report(exc: Exception) -> None:
        widget.setWindowTitle(f"failed: {exc}")
        raise exc

    running = Operation(widget, broken).failure(show_then_report).run()
    qloop.run_until_complete(asyncio.wait_for(running.wait(), WAIT))
    assert widget.windowTitle() == "failed: disk gone"
    assert [str(error) for error in reported] == ["disk gone"]


def test_a_deleted_widget_gets_nothing(qloop: asyncio.AbstractEventLoop, reported: list[BaseException]) -> None:
    page = QWidget()
    gate, reporting = threading.Event(), threading.Event()
    delivered: list[object] = []

    def work(job: Job) -> str:
        gate.wait(WAIT)
        job.report(0.9)
        reporting.set()
        return "late"

    def fails(_job: Job) -> str:
        gate.wait(WAIT)
        raise ValueError("late failure")

    running = Operation(page, work, delivered.append).with_progress(delivered.append).run()
    failing = Operation(page, fails).failure(delivered.append, ValueError).run()
    shiboken6.delete(page)
    gate.set()
    qloop.run_until_complete(asyncio.wait_for(asyncio.gather(running.wait(), failing.wait()), WAIT))
    assert reporting.is_set()
    qloop.run_until_complete(asyncio.sleep(0.05))
    assert delivered == [] and reported == []


def test_a_coroutine_operation_is_cancelled_at_its_await_when_a_newer_one_starts(
    widget: QWidget, qloop: asyncio.AbstractEventLoop
) -> None:
    steps: list[str] = []

    async def read(job: Job, name: str) -> str:
        steps.append(f"{name} started")
        await asyncio.sleep(0.05)
        steps.append(f"{name} read")
        return name

    shown: list[str] = []
    older = CoroutineOperation(widget, lambda job: read(job, "older"), shown.append, group="reading").run()
    qloop.run_until_complete(asyncio.sleep(0.01))
    newer = CoroutineOperation(widget, lambda job: read(job, "newer"), shown.append, group="reading").run()
    qloop.run_until_complete(asyncio.wait_for(asyncio.gather(older.wait(), newer.wait()), WAIT))
    assert shown == ["newer"] and "older read" not in steps and older.task.cancelled()
