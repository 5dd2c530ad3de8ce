"""Runs followed by the app: each live run is driven by a background task on the app's event loop.

The app never blocks on a run: :meth:`RunManager.launch` records the run and returns at once, and the engine then
connects, uploads, trains and pulls in a task. When the app starts again, :meth:`RunManager.reattach_all` picks
up every run that was live, so checkpoints keep coming home.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from desktop.core.runs.spec import RunSpec, SshTarget
from desktop.core.runs.states import LIVE, TERMINAL
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.rentals import compute_of, rental_of
from desktop.services.machines.machine import Connect
from desktop.services.platform.logs import get_logger, redact_known
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.tasks import cancel_and_wait
from desktop.services.providers.base import ProviderError
from desktop.services.renting.driver import RentalDriver
from desktop.services.renting.ending import end_rentals_first
from desktop.services.runs import connection
from desktop.services.runs.engine import EngineOptions, RunBusyError, RunEngine, RunError
from desktop.services.runs.remote_export import check_before_renting
from desktop.services.runs.store import RunRecord, RunStore

#: Called with (run id, line) for every progress line of a driven run.
Listener = Callable[[str, str], None]
_log = get_logger("runs")


class RunManager:
    """Starts, follows, stops and resumes runs in the background of the running app."""

    def __init__(
        self,
        store: RunStore,
        secrets: SecretStore,
        options: EngineOptions | None = None,
        *,
        connect: Connect = connection.ssh_connect,
    ) -> None:
        """Follows no run yet; ``connect`` logs its engines in to machines (SSH unless a test gives another)."""
        self.store, self.secrets, self.options = store, secrets, options or EngineOptions()
        self._connect = connect
        self._tasks: dict[str, asyncio.Task[RunRecord | None]] = {}
        self._listeners: list[Listener] = []
        self._engines: dict[str, RunEngine] = {}
        #: Asks the user whether a run whose first measured steps overrun goes on (the app sets it); None: stop.
        self.ask_overrun: Callable[[str, str], Awaitable[bool]] | None = None

    def use_options(self, options: EngineOptions) -> None:
        """Applies new engine options (changed preferences) to the runs followed now and to later ones."""
        self.options = options
        for engine in self._engines.values():
            engine.options = options

    def add_listener(self, listener: Listener) -> None:
        """Registers a callback for the progress lines of every driven run."""
        self._listeners.append(listener)

    def engine(self, run_id: str | None = None) -> RunEngine:
        """The engine of ``run_id`` (one per run, so its pulls never overlap); progress lines go to the listeners."""
        key = run_id or ""
        if key not in self._engines:
            self._engines[key] = RunEngine(
                self.store, self.secrets, self.options, report=lambda line: self._emit(key, line), connect=self._connect
            )
            self._engines[key].ctx.ask_overrun = self._ask_overrun
        return self._engines[key]

    async def _ask_overrun(self, run_id: str, words: str) -> bool:
        """Asks through :attr:`ask_overrun` as it is now (the window may set it after the engines were made)."""
        return await self.ask_overrun(run_id, words) if self.ask_overrun is not None else False

    def _emit(self, run_id: str, line: str) -> None:
        clean = redact_known(line)  # listeners show it (the UI) and keep it: no secret goes past here
        if clean != line:
            line = type(line)(clean)  # the same kind of line (an event's words stay an event's)
        for listener in list(self._listeners):
            listener(run_id, line)

    def launch(self, spec: RunSpec) -> RunRecord:
        """Records a run for ``spec`` and starts driving it in the background.

        Raises:
            RunError: The spec cannot be run (no target, missing data); the message says what to fix.
        """
        record = self.engine().create(spec)
        self.follow(record.id)
        return record

    async def launch_in_background(self, spec: RunSpec) -> RunRecord:
        """:meth:`launch` for the UI: the run's key goes to the keyring off the event loop (it may prompt).

        Raises:
            RunError: The spec cannot be run; the message says what to fix.
        """
        loop = asyncio.get_running_loop()

        def report(line: str) -> None:  # listeners (widgets) hear it on the loop's thread, never from the worker
            loop.call_soon_threadsafe(self._emit, "", line)

        await check_before_renting(spec, lambda text, _fraction: report(text))
        creator = RunEngine(self.store, self.secrets, self.options, report=report, connect=self._connect)
        record = await asyncio.to_thread(creator.create, spec)
        self.follow(record.id)
        return record

    def is_driving(self, run_id: str) -> bool:
        """Whether this app is following the run right now."""
        task = self._tasks.get(run_id)
        return task is not None and not task.done()

    def follow(self, run_id: str) -> None:
        """Drives the run in a background task (no-op when already driven here)."""
        if self.is_driving(run_id):
            return
        self._tasks[run_id] = asyncio.ensure_future(self._drive(run_id))

    async def _drive(self, run_id: str) -> RunRecord | None:
        try:
            record = await self._driven(run_id)
        except RunBusyError as exc:
            self._emit(run_id, str(exc))
            return None
        except (RunError, ProviderError) as exc:
            self._emit(run_id, f"failed: {exc}")
            return self.store.update(run_id, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a background task must never die silently
            _log.exception("driving run %s failed", run_id)
            self._emit(run_id, f"failed: {type(exc).__name__}: {exc}")
            return self.store.update(run_id, error=f"{type(exc).__name__}: {exc}")
        self._emit(run_id, f"run {record.state.value}" + (f": {record.error}" if record.error else ""))
        return record

    async def _driven(self, run_id: str) -> RunRecord:
        """Drives the run to its end; a rented run through the rental driver, which terminates its machine."""
        if compute_of(self.store.get(run_id)) is None:
            return await self.engine(run_id).drive(run_id)
        return await RentalDriver(self.engine(run_id)).drive(run_id)

    async def _release_if_ended(self, run_id: str, record: RunRecord) -> RunRecord:
        """Terminates an ended rented run's machine (the rental driver does it when it follows the run)."""
        if record.state in TERMINAL and rental_of(record) is not None:
            driver = RentalDriver(self.engine(run_id))
            try:
                await driver.release(run_id, f"the run was stopped ({record.state.value})")
            finally:
                await driver.aclose()
        return self.store.get(run_id)

    def reattach_all(self) -> list[str]:
        """Follows every run that was live when the app last closed; returns their ids."""
        live = [record.id for record in self.store.all() if record.state in LIVE]
        for run_id in live:
            self.follow(run_id)
        return live

    async def wait(self, run_id: str) -> RunRecord:
        """Waits until the background task of a run ends; returns the run's record."""
        task = self._tasks.get(run_id)
        if task is not None:
            await asyncio.shield(task)
        return self.store.get(run_id)

    async def stop(self, run_id: str) -> RunRecord:
        """Stops the trainer keeping a checkpoint (pulled home), and ends the run as cancelled.

        Before the trainer has started (uploading, installing) there is nothing to save: following stops at once.
        """
        if self.is_driving(run_id) and self.store.get(run_id).pid is None:
            await self._cancel(run_id)
        if not self.is_driving(run_id):
            self._end_rentals_first(run_id)
            return await self._release_if_ended(run_id, await self.engine(run_id).stop(run_id))
        await self.engine(run_id).request_stop(run_id)
        return await self._release_if_ended(run_id, await self.wait(run_id))

    def _end_rentals_first(self, run_id: str) -> None:
        """A rented run stopped here has its machine marked terminating before it is cancelled, as a driver does."""
        if compute_of(self.store.get(run_id)) is not None:
            end_rentals_first(self.engine(run_id).ctx, Ledger())

    async def _cancel(self, run_id: str) -> None:
        """Ends the task driving ``run_id`` (a trainer that started meanwhile is stopped by the caller, by its pid)."""
        task = self._tasks.get(run_id)
        if task is not None:
            with contextlib.suppress(Exception):  # the drive's own failure is in its record
                await cancel_and_wait(task)

    async def pull(self, run_id: str) -> Path | None:
        """Pulls the newest checkpoint now; returns the local folder (None when there is none yet)."""
        return await self.engine(run_id).pull(run_id, driven_here=self.is_driving(run_id))

    def resume(self, run_id: str, target: SshTarget | None = None) -> None:
        """Continues a paused, failed or stopped run, optionally on another machine (blocking: see below).

        Raises:
            RunError: The run cannot be resumed; the message says why.
        """
        self._prepare_resume(run_id, target)
        self.follow(run_id)

    async def resume_in_background(
        self, run_id: str, target: SshTarget | None = None, *, targets: Sequence[SshTarget] = ()
    ) -> RunRecord:
        """:meth:`resume` for the UI: a rented run's new key goes to the keyring off the event loop (it may prompt).

        ``target`` moves a run on one machine to another server; ``targets`` moves a run on several machines to a
        fresh set, one per machine, the head first.

        Returns:
            The run's record as it is driven on (a stopped run is paused now, on its way to its machine).

        Raises:
            RunError: The run cannot be resumed; the message says why.
        """
        record = await asyncio.to_thread(self._prepare_resume, run_id, target, targets)
        self.follow(run_id)
        return record

    def _prepare_resume(self, run_id: str, target: SshTarget | None, targets: Sequence[SshTarget] = ()) -> RunRecord:
        engine = self.engine(run_id)
        if target is not None:
            engine.retarget(run_id, target)
        if targets:
            engine.retarget_nodes(run_id, list(targets))
        return engine.prepare_resume(run_id)

    async def close(self) -> None:
        """Stops following runs (training goes on on the machines; the next start reattaches)."""
        tasks = [task for task in self._tasks.values() if not task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
