"""Settling rentals a process left unfinished, and machines left running after their run ended.

Run at every start of the app and of ``rentune run|resume|runs|machines|costs`` (and in the app's background):

* a rental still ``creating`` (the process died or lost the answer mid-create) is looked up at its provider by its
  label: a machine found is recorded and terminated (the run rents anew when resumed), none found means none was made;
* a rental still ``terminating`` is terminated again until its provider says it is gone;
* a rental still ``live`` whose run has ended (finished, failed or cancelled: the process ended the run and was killed
  before terminating its machine) is marked ``terminating`` and terminated the same way.

A run another process drives now (its renting lock is held) is left to that process. A provider that does not
answer leaves its rows as they are, for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import filelock

from desktop.core.runs.progress import ENDED
from desktop.services.billing.ledger import UNSETTLED_STATES, Ledger, Rental, RentalState
from desktop.services.platform.secrets import SecretStore, SecretStoreError
from desktop.services.providers.base import Instance, Provider, ProviderError, ProviderName
from desktop.services.providers.market import OpenProvider
from desktop.services.providers.registry import open_provider
from desktop.services.renting.ending import to_settle
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.store import RunStore, UnknownRunError

#: Held by a renting driver for as long as it drives a run (apart from the engine's own lock).
RENTING_LOCK_NAME = ".renting.lock"
#: A provider's start time more than this far from the intent is not believed.
START_SLACK_S = 600.0


@dataclass
class Settlement:
    """What one reconciliation did.

    Attributes:
        adopted: Machines a lost create made, found by label (then terminated).
        not_created: Intents with no machine at their provider.
        terminated: Machines confirmed gone.
        still_terminating: Rentals whose provider has not yet said their machine is gone.
        run_ended: Machines found still running after their run had ended (terminated).
        busy: Rentals left alone because another process drives their run.
        notes: One line per provider that could not be asked, and why.
    """

    adopted: list[Rental] = field(default_factory=list)
    not_created: list[Rental] = field(default_factory=list)
    terminated: list[Rental] = field(default_factory=list)
    still_terminating: list[Rental] = field(default_factory=list)
    run_ended: list[Rental] = field(default_factory=list)
    busy: list[Rental] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        """One line per thing the user should know."""
        lines = [f"found {_words(r)} made by a create whose answer was lost: terminated it" for r in self.adopted]
        lines += [f"terminated {_words(r)}, left billing by an earlier attempt" for r in self.terminated]
        lines += [
            f"terminated {_words(r)}: the run had ended but its machine was still running and billing "
            "(Rentune was closed before it could terminate it)"
            for r in self.run_ended
        ]
        lines += [
            f"{_words(r)} is still being terminated: Rentune retries until its provider says it is gone"
            for r in self.still_terminating
        ]
        return lines + self.notes


def _words(rental: Rental) -> str:
    return f"{_label(rental.provider)} machine {rental.instance_id or rental.label} of run {rental.run_id}"


def _label(provider: str) -> str:
    try:
        return ProviderName(provider).label
    except ValueError:
        return provider


def started_at(intent: Rental, instance: Instance) -> float | None:
    """The provider's start time of a machine when it is believable for this intent (else None: the intent's)."""
    created = instance.created_at
    if created is None or abs(created - intent.started) > START_SLACK_S:
        return None
    return max(created, intent.started)


def not_booked(ledger: Ledger, provider: str, found: list[Instance]) -> list[Instance]:
    """The machines of ``found`` that no ledger row records yet.

    Every machine of a run carries the run's label, so looking a create's machine up by label also finds the run's
    earlier machines (one still being terminated, say): those are their own rows' to settle, never this create's.
    """
    return [instance for instance in found if ledger.get(provider, instance.instance_id) is None]


@contextlib.contextmanager
def renting_lock(folder: Path) -> Iterator[bool]:
    """Holds a run's renting lock while inside; yields False (holding nothing) when another process holds it."""
    lock = filelock.FileLock(folder / RENTING_LOCK_NAME, blocking=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


class Reconciler:
    """Settles with their providers the ledger's ``creating`` and ``terminating`` rentals, and ended runs' live ones.

    Args:
        store: The runs (for their folders' locks).
        ledger: The rentals.
        secrets: Where API keys are read.
        open: Opens a provider's client (tests inject their own).
        terminator: How machines are terminated (a fast one in tests).
        patience: Seconds each machine is given to be confirmed gone before it is left for the next start.
        close_clients: Whether clients opened here are closed when done (a driver lends its own and keeps them).
    """

    def __init__(
        self,
        store: RunStore,
        ledger: Ledger,
        secrets: SecretStore | None = None,
        *,
        open: OpenProvider = open_provider,
        terminator: Terminator | None = None,
        patience: float = 20.0,
        close_clients: bool = True,
    ) -> None:
        self.store, self.ledger, self.secrets, self._open = store, ledger, secrets, open
        self.terminator = terminator or Terminator(ledger)
        self.patience = patience
        self.close_clients = close_clients

    async def settle_run(self, run_id: str, *, keep: tuple[str, str] | None) -> Settlement:
        """Settles one run's rentals for the driver that holds it.

        Its unsettled rows, and every machine it rented that is still live but not ``keep`` (the machine the run
        records it uses), which no one would stop.
        """
        done = Settlement()
        for row in await asyncio.to_thread(self.ledger.machines, run_id):
            stray = row.state is RentalState.LIVE and (row.provider, row.instance_id) != keep
            if row.state in UNSETTLED_STATES or stray:
                await self._with_client(row.provider, [row], done, locked=True)
        return done

    async def settle(self) -> Settlement:
        """Settles every rental left to settle (:func:`to_settle`), one at a time per provider, providers at once."""
        done = Settlement()
        by_provider: dict[str, list[Rental]] = {}
        for rental in await asyncio.to_thread(to_settle, self.ledger, self.store):
            by_provider.setdefault(rental.provider, []).append(rental)
        await asyncio.gather(*(self._with_client(name, rows, done) for name, rows in by_provider.items()))
        return done

    async def _with_client(self, provider: str, rows: list[Rental], done: Settlement, *, locked: bool = False) -> None:
        try:
            client = self._open(ProviderName(provider), self.secrets)
        except (ProviderError, SecretStoreError, ValueError) as exc:
            count = "1 rental" if len(rows) == 1 else f"{len(rows)} rentals"
            done.notes.append(f"cannot settle {count} at {_label(provider)} now: {exc}")
            return
        try:
            for row in rows:
                await self._settle_row(client, row, done, locked=locked)
        finally:
            if self.close_clients:
                await client.aclose()

    async def _settle_row(self, client: Provider, row: Rental, done: Settlement, *, locked: bool) -> None:
        folder = self.store.runs_dir / row.run_id
        free_here = locked or not folder.is_dir()
        with contextlib.nullcontext(True) if free_here else renting_lock(folder) as free:
            if not free:
                done.busy.append(row)
                return
            if not locked and row.state is RentalState.LIVE and not self._run_ended(row.run_id):
                return  # taken up again (resumed) since it was listed: its driver owns the machine
            try:
                await self._settle_held(client, row, done)
            except ProviderError as exc:
                done.notes.append(f"cannot settle {_words(row)} now: {exc.message}")

    async def _settle_held(self, client: Provider, row: Rental, done: Settlement) -> None:
        """Settles one rental of a run no other process drives: a create is looked up, anything else terminated."""
        if row.state is RentalState.CREATING:
            await self._settle_create(client, row, done)
            return
        # A live row is marked terminating first (as every terminate does), then terminated until gone.
        ended = row.state is RentalState.LIVE and self._run_ended(row.run_id)
        await self._finish(client, row, done, done.run_ended if ended else done.terminated)

    def _run_ended(self, run_id: str) -> bool:
        """Whether the run has ended now (a run deleted meanwhile had ended: only ended runs can be deleted)."""
        try:
            record = self.store.get(run_id)
        except UnknownRunError:
            return True
        return record.id != run_id or record.state in ENDED

    async def _settle_create(self, client: Provider, row: Rental, done: Settlement) -> None:
        found = not_booked(self.ledger, row.provider, await client.named(row.label)) if row.label else []
        if not found:
            done.not_created.append(await asyncio.to_thread(self.ledger.not_created, row.id))
            return
        first, *extra = found
        adopted = self.ledger.created(row.id, first.instance_id, started=started_at(row, first))
        rows = [adopted] + [
            self.ledger.open(row.run_id, row.provider, i.instance_id, row.gpu, row.price_per_hour, label=row.label)
            for i in extra
        ]
        for rental in rows:
            await self._finish(client, rental, done, done.adopted)

    async def _finish(self, client: Provider, row: Rental, done: Settlement, into: list[Rental]) -> None:
        assert row.instance_id is not None  # live and terminating rows name their machine
        if await self.terminator.until_gone(client, row.instance_id, patience=self.patience):
            into.append(self.ledger.get(row.provider, row.instance_id) or row)
        else:
            why = self.terminator.why_not(row.provider, row.instance_id)
            done.still_terminating.append(row)
            if why:
                done.notes.append(f"{_words(row)}: {why}")


async def settle_rentals(
    store: RunStore,
    secrets: SecretStore | None = None,
    *,
    ledger: Ledger | None = None,
    open: OpenProvider = open_provider,
    time_limit: float = 60.0,
    terminator: Terminator | None = None,
    patience: float = 20.0,
) -> Settlement:
    """Settles the rentals left to settle within ``time_limit`` seconds (what is left waits for the next start).

    Creates without an answer, terminates not yet confirmed, and live machines of runs that have ended
    (:func:`to_settle`).

    Args:
        store: The runs.
        secrets: Where API keys are read.
        ledger: The rentals (the app's by default).
        open: Opens a provider's client.
        time_limit: Seconds for all of it.
        terminator: How machines are terminated (by default with the standard backoff).
        patience: Seconds each machine is given to be confirmed gone.
    """
    book = ledger if ledger is not None else await asyncio.to_thread(Ledger)
    reconciler = Reconciler(store, book, secrets, open=open, terminator=terminator, patience=patience)
    if not await asyncio.to_thread(to_settle, book, store):
        return Settlement()
    started = time.monotonic()
    try:
        return await asyncio.wait_for(reconciler.settle(), time_limit)
    except TimeoutError:
        waited = time.monotonic() - started
        return Settlement(notes=[f"settling rentals took over {waited:.0f} s; the rest is settled at the next start"])
