"""Rentune processes of the soak, and how they die: a process is a thread with its own event loop, engine and rental
driver, killed at a random moment or at a chosen point of its work (after its n-th provider call, after its n-th state
write, right after a create took effect). A kill freezes the process where it stands: nothing it was doing finishes
and none of its cleanup runs, as with a real kill.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from desktop.services.billing.ledger import Ledger
from desktop.services.machines.ssh import Endpoint
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import Provider, ProviderName
from desktop.services.renting.creating import CreateTiming
from desktop.services.renting.driver import RentalDriver, RentalOptions
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.store import RunStore
from tests.fakes.http import FakeCloud, FakeRequest

#: Seconds a process's terminate is retried before the rental is left ``terminating`` (for the next settle).
TERMINATE_PATIENCE_S = 1.0
#: Seconds between a process's settles in the background (the app settles every minute; the soak's runs last seconds).
SETTLE_EVERY_S = 0.5
#: What a killed process's frozen threads wait on: never set.
_NEVER = threading.Event()

Connect = Callable[[Endpoint, str | None, float], Any]


@dataclass(frozen=True)
class KillPoint:
    """Where a process is killed (besides a random moment).

    Named by the step itself, not by its place in the life, so that a busy machine (more or fewer status polls while a
    machine boots or trains) still reaches it: the ``n``-th time the process does ``what`` (counted from the first
    ``after``, when given).

    Attributes:
        kind: "call": after a provider call (answered or not); "write": after a state write (a ledger write, a run's
            state or spec); "create": right after a create call took effect.
        n: Which occurrence of ``what``.
        what: The step, machine ids written ``{id}`` (``GET /v2/pods/{id}``, ``ledger.terminating``).
        after: The step the count starts at (``run -> pulling``), or None: from the process's start.
    """

    kind: str
    n: int = 0
    what: str = ""
    after: str | None = None


def step_name(step: str) -> str:
    """A step as a kill point names it: a call to any machine is one name (``GET /v2/pods/{id}``)."""
    return re.sub(r"/[0-9a-f]{4,}\b", "/{id}", step)


class DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """A process's executor (``asyncio.to_thread``): each call on a daemon thread of its own. A worker frozen by a kill
    must not hold up the interpreter's exit, as the pool's own workers would (they are joined at exit)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Runs ``fn`` on a new daemon thread."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as the pool does
                future.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to shut down (each thread ends with its call)."""


def freeze() -> None:
    """The calling thread of a killed process stops here for good (a daemon thread: the interpreter exits past it)."""
    _NEVER.wait()


class KillSwitchTransport(httpx.AsyncBaseTransport):
    """A client transport that counts its process's provider calls and kills the process at its kill point."""

    def __init__(self, inner: httpx.AsyncBaseTransport, process: Process, cloud: FakeCloud) -> None:
        self.inner, self.process, self.cloud = inner, process, cloud

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Passes the call on; after it (answered or failed), kills the process when this is its kill point."""
        if self.process.killed.is_set():
            await asyncio.Event().wait()  # a killed process makes no more calls
        try:
            return await self.inner.handle_async_request(request)
        finally:
            self.process.after_call(f"{request.method} {request.url.path}", self._creates(request))

    def _creates(self, request: httpx.Request) -> bool:
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = b""
        return self.cloud.is_create(FakeRequest(request.method, request.url.path, {}, {}, body))


class Process:
    """One Rentune process: a thread with its own event loop, engine and rental driver, settling in the background as
    the app does. :meth:`kill` stops it dead; a :class:`KillPoint` kills it from within, at that point.

    Args:
        name: The thread's name.
        open_client: A provider's client for this process (its transport wrapped in :class:`KillSwitchTransport`).
        connect: How the engine logs in to a machine.
        kill_point: Where to die, or None.
    """

    graveyard: list[Any] = []  # noqa: RUF012 - killed loops and their tasks, kept so no cleanup ever runs

    def __init__(
        self,
        name: str,
        open_client: Callable[[ProviderName, Process], Provider],
        connect: Connect,
        kill_point: KillPoint | None = None,
    ) -> None:
        self.name, self.kill_point = name, kill_point
        self.killed = threading.Event()
        self._anchored, self._seen = kill_point is None or kill_point.after is None, 0  # see KillPoint
        self.trail: list[str] = []  # its provider calls and state writes, in order
        self.died_at = ""  # what the process did last before its kill point
        self.lines: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(DaemonThreads())
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._count_lock = threading.Lock()
        store = CountingRunStore(self)
        self.engine = RunEngine(
            store,
            SecretStore(),
            EngineOptions(poll_seconds=0.02, grace_seconds=1.0),
            report=self.lines.append,
            connect=connect,
        )
        ledger = CountingLedger(self)
        self.open_client = lambda provider, _secrets: open_client(provider, self)
        self.driver = RentalDriver(
            self.engine,
            ledger=ledger,
            options=RentalOptions(
                poll_seconds=0.05,
                ready_poll_seconds=0.02,
                budget_poll_seconds=0.05,
                terminate_patience=TERMINATE_PATIENCE_S,
                create=CreateTiming(answer_wait=1.0, lookup_delay=0.02, terminate_patience=TERMINATE_PATIENCE_S),
            ),
            open_provider=self.open_client,
            terminator=Terminator(ledger, sleep=_short_sleep),
        )
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Runs a coroutine on the process's loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    # -- dying ---------------------------------------------------------------------------------------------------

    def kill(self) -> None:
        """Stops the process dead from outside: its loop stops, nothing it was doing finishes, no cleanup runs."""
        self.killed.set()
        self.loop.call_soon_threadsafe(self.loop.stop)

    def after_call(self, call: str, creates: bool) -> None:
        """Counts a provider call; dies here when it is the kill point (a create, or the named call)."""
        point = self.kill_point
        self._stepped(call, "call", due=point is not None and point.kind == "create" and creates)

    def before_write(self) -> None:
        """A killed process writes nothing more."""
        if self.killed.is_set():
            freeze()

    def after_write(self, what: str) -> None:
        """Counts a state write; dies here when it is the kill point."""
        self._stepped(what, "write")

    def _stepped(self, step: str, kind: str, due: bool = False) -> None:
        with self._count_lock:
            self.trail.append(step)
            point = self.kill_point
            if point is not None and step == point.after:
                self._anchored, self._seen = True, 0
            if point is not None and point.kind == kind and self._anchored and step_name(step) == point.what:
                self._seen += 1
                due = due or self._seen == point.n
        if due:
            self.died_at = step
            self._die_here()

    def _die_here(self) -> None:
        """Killed right here: this thread (the loop's own, or a worker's) stops for good, and so does the loop."""
        self.kill()
        freeze()

    def bury(self) -> None:
        """After a kill: keeps the dead loop and its tasks (so nothing is ever collected and cleaned up)."""
        self.thread.join(0.5)  # a loop frozen mid-callback never returns; one stopped from outside does at once
        Process.graveyard.append((self.loop, list(asyncio.all_tasks(self.loop))))

    def stop(self) -> None:
        """Ends a process that finished its work (its background settle is cancelled)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))  # the cancelled tasks end here, on a live process
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()


class CountingLedger(Ledger):
    """The process's ledger: every write is counted as a state write (a kill point), and a killed process writes none.

    Args:
        process: The process whose writes these are.
    """

    def __init__(self, process: Process) -> None:
        super().__init__()
        self.process = process

    def _write(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.process.before_write()
        result = getattr(super(), name)(*args, **kwargs)
        self.process.after_write(f"ledger.{name}")
        return result

    def open(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.open`."""
        return self._write("open", *args, **kwargs)

    def intend(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.intend`."""
        return self._write("intend", *args, **kwargs)

    def sending(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.sending`."""
        return self._write("sending", *args, **kwargs)

    def created(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.created`."""
        return self._write("created", *args, **kwargs)

    def not_created(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.not_created`."""
        return self._write("not_created", *args, **kwargs)

    def stop_sent(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.stop_sent`."""
        return self._write("stop_sent", *args, **kwargs)

    def terminating(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.terminating`."""
        return self._write("terminating", *args, **kwargs)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        """Counted :meth:`Ledger.close`."""
        return self._write("close", *args, **kwargs)


class CountingRunStore(RunStore):
    """The process's run store: a run's state and spec writes are counted as state writes too.

    Args:
        process: The process whose writes these are.
    """

    def __init__(self, process: Process) -> None:
        super().__init__()
        self.process = process

    def transition(self, run_id: str, state: Any, note: str = "", *, reopen: bool = False) -> Any:
        """Counted :meth:`RunStore.transition`."""
        self.process.before_write()
        record = super().transition(run_id, state, note, reopen=reopen)
        self.process.after_write(f"run -> {record.state.value}")
        return record

    def update(self, run_id: str, **fields: Any) -> Any:
        """Counted :meth:`RunStore.update`."""
        self.process.before_write()
        record = super().update(run_id, **fields)
        self.process.after_write(f"run {'/'.join(fields)}")
        return record


def stuck_tasks(process: Process) -> list[str]:
    """Where each task of a stopped process waited (for a schedule that got stuck)."""
    lines = []
    for task in asyncio.all_tasks(process.loop):
        chain, coroutine = [], task.get_coro()
        while coroutine is not None and hasattr(coroutine, "cr_frame"):
            frame = coroutine.cr_frame
            if frame is not None:
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            coroutine = coroutine.cr_await
        lines.append(f"task {task.get_name()}: {' -> '.join(chain)} (waits on {coroutine!r:.80})")
    return lines


async def _short_sleep(_seconds: float) -> None:
    await asyncio.sleep(0.02)
