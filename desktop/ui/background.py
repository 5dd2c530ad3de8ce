"""Background work for widgets: started off the UI thread, its outcome delivered back only while it still matters.

:class:`Operation` is the one way a page runs work in the background, in the shape of Anki's ``QueryOp``::

    Operation(self, lambda job: check(path, progress=job.report, cancel=job.cancel), self.show_check, group="check")
        .with_progress(self.show_fraction)
        .failure(self.show_unreadable, OSError)
        .run()

The work runs in the default executor (or, with :class:`CoroutineOperation`, as a coroutine on the loop); its
progress, result and failure reach the page on the UI thread. Starting work in a group cancels the group's older
work (newest wins, so a stale result never lands); a cancelled operation and a deleted widget get nothing. A
failure the page does not handle goes to ``sys.excepthook``, the app's error reporter, as :func:`spawn` does.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Self, TypeVar

import shiboken6
from PySide6.QtWidgets import QWidget

T = TypeVar("T")

#: The work running now in each (widget, group); an entry leaves when its work ends.
_CURRENT: dict[tuple[int, str], Running[Any]] = {}


async def off_ui_thread(widget: QWidget, work: Callable[..., T], *args: object) -> T:
    """Runs ``work(*args)`` in the default executor and returns its result to a widget that still exists.

    For one blocking step inside a longer async flow of a page (launching a run); use :class:`Operation` for work
    with a result to show.

    Raises:
        asyncio.CancelledError: The widget was deleted meanwhile (its window closed); the calling task just ends.
    """
    result = await asyncio.get_running_loop().run_in_executor(None, work, *args)
    if not shiboken6.isValid(widget):
        raise asyncio.CancelledError
    return result


def spawn(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Starts background UI work whose failure must not vanish: errors go to the app's error reporter."""
    task = asyncio.ensure_future(coroutine)
    task.add_done_callback(_report_failure)
    return task


def _report_failure(task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        sys.excepthook(type(error), error, error.__traceback__)


class Job:
    """What the work of an operation sees: a cancel flag to poll and a progress reporter, both thread-safe.

    Attributes:
        cancel: Set when the operation is cancelled or a newer one of its group starts; the work should stop at
            its next check (``CheckCancelledError``, an early return: nothing it returns is delivered anyway).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver_progress: Callable[[Any], None]) -> None:
        self.cancel = threading.Event()
        self._loop = loop
        self._deliver_progress = deliver_progress

    @property
    def cancelled(self) -> bool:
        """Whether the work should stop."""
        return self.cancel.is_set()

    def report(self, value: Any) -> None:
        """Sends a progress value to the page's progress handler, on the UI thread (callable from any thread)."""
        if not self.cancelled:
            self._loop.call_soon_threadsafe(self._deliver_progress, value)


class Running(Generic[T]):
    """An operation that was started: its task, its job, and how to cancel it or wait for it.

    Attributes:
        task: The asyncio task delivering the outcome; it ends cancelled when the operation is cancelled.
        job: What the work sees (its ``cancel`` flag is set by :meth:`cancel`).
    """

    def __init__(self, task: asyncio.Task[None], job: Job) -> None:
        self.task, self.job = task, job

    @property
    def active(self) -> bool:
        """Whether the outcome is still to come."""
        return not self.task.done()

    def cancel(self) -> None:
        """Stops the operation: the work's cancel flag is set, and nothing more is delivered."""
        self.job.cancel.set()
        self.task.cancel()

    async def wait(self) -> None:
        """Waits until the outcome was delivered, or the operation cancelled; never raises the work's failure."""
        await asyncio.wait({self.task})


class _Operation(ABC, Generic[T]):
    """What every operation shares: the widget, the handlers, the group, and how the outcome is delivered."""

    def __init__(self, parent: QWidget, success: Callable[[T], None] | None, group: str | None) -> None:
        self._parent, self._success, self._group = parent, success, group
        self._progress: Callable[[Any], None] | None = None
        self._failures: list[tuple[tuple[type[Exception], ...], Callable[[Any], None]]] = []

    def failure(self, handler: Callable[[Any], None], *kinds: type[Exception]) -> Self:
        """Sends failures of ``kinds`` (every ``Exception`` when none is named) to ``handler``.

        Other failures, and whatever a handler raises, go to ``sys.excepthook``.
        """
        self._failures.append((kinds or (Exception,), handler))
        return self

    def with_progress(self, handler: Callable[[Any], None]) -> Self:
        """Sends what the work passes to ``job.report`` to ``handler`` on the UI thread."""
        self._progress = handler
        return self

    def run(self) -> Running[T]:
        """Starts the work, cancelling the older work of the same group."""
        loop = asyncio.get_event_loop()
        job = Job(loop, lambda value: self._deliver_progress(job, value))
        running: Running[T] = Running(loop.create_task(self._outcome(job)), job)
        running.task.add_done_callback(_report_failure)
        if self._group is not None:
            _enter_group((id(self._parent), self._group), running)
        return running

    @abstractmethod
    def _start(self, job: Job) -> Awaitable[T]:
        """Starts the work; what it returns is awaited on the UI loop."""

    async def _outcome(self, job: Job) -> None:
        try:
            result = await self._start(job)
        except Exception as exc:  # noqa: BLE001 - every failure goes to a handler or the error reporter
            self._fail(job, exc)
            return
        if self._deliverable(job) and self._success is not None:
            self._success(result)

    def _deliverable(self, job: Job) -> bool:
        return not job.cancelled and shiboken6.isValid(self._parent)

    def _deliver_progress(self, job: Job, value: Any) -> None:
        if self._progress is not None and self._deliverable(job):
            self._progress(value)

    def _fail(self, job: Job, exc: Exception) -> None:
        """Hands the failure to its handler while it matters; one no handler takes goes to the error reporter."""
        handler = next((handler for kinds, handler in self._failures if isinstance(exc, kinds)), None)
        if handler is None:
            raise exc
        if self._deliverable(job):
            handler(exc)


class Operation(_Operation[T]):
    """Blocking work for a widget, run in the default executor; its outcome comes back on the UI thread.

    Args:
        parent: The widget the outcome is for; once it is deleted, nothing is delivered.
        op: The blocking work, called with its :class:`Job`.
        success: Called with the work's result (not called when the operation was cancelled).
        group: Starting work in a group of ``parent`` cancels the older work of that group (newest wins).
    """

    def __init__(
        self,
        parent: QWidget,
        op: Callable[[Job], T],
        success: Callable[[T], None] | None = None,
        *,
        group: str | None = None,
    ) -> None:
        super().__init__(parent, success, group)
        self._op = op

    def _start(self, job: Job) -> Awaitable[T]:
        return asyncio.get_running_loop().run_in_executor(None, self._op, job)


class CoroutineOperation(_Operation[T]):
    """Like :class:`Operation`, for work that is a coroutine on the UI loop awaiting its own blocking steps.

    For work done in steps with state between them (a log read chunk by chunk); cancelling it cancels the
    coroutine at its next ``await``.
    """

    def __init__(
        self,
        parent: QWidget,
        op: Callable[[Job], Awaitable[T]],
        success: Callable[[T], None] | None = None,
        *,
        group: str | None = None,
    ) -> None:
        super().__init__(parent, success, group)
        self._op = op

    def _start(self, job: Job) -> Awaitable[T]:
        return self._op(job)


def cancel_group(parent: QWidget, group: str) -> None:
    """Cancels the work running in ``parent``'s ``group``, if any."""
    running = _CURRENT.get((id(parent), group))
    if running is not None:
        running.cancel()


def _enter_group(key: tuple[int, str], running: Running[Any]) -> None:
    """Makes ``running`` the group's work, cancelling the older one; it leaves the group when it ends."""
    older = _CURRENT.get(key)
    if older is not None:
        older.cancel()
    _CURRENT[key] = running

    def leave(_task: asyncio.Future[None]) -> None:
        if _CURRENT.get(key) is running:
            del _CURRENT[key]

    running.task.add_done_callback(leave)
