"""The money ledger: every rented machine, its price and when it started and stopped, in SQLite.

The file is ``RENTUNE_HOME/data/ledger.sqlite``. The app and a detached ``rentune run`` may write at once, so the
database runs in WAL mode with a busy timeout, and every call opens its own short-lived connection (safe across
threads and processes). A rental is written before its create request (state ``creating``, with the machine's
label), so a machine made by a create whose answer never came is found again by that label. Dollars are the
recorded price per hour times the rented hours, from the provider's own start and end times where it reports them
(else the moments Rentune saw).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from time import monotonic, sleep  # apart from time.time, which tests set
from typing import Any

from desktop.services.platform.paths import app_paths

#: The schema this code reads and writes (``PRAGMA user_version``).
SCHEMA_VERSION = 2
#: Seconds a writer waits for another process's transaction before giving up.
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rentals (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    instance_id TEXT,
    gpu TEXT NOT NULL,
    price_per_hour REAL NOT NULL,
    started REAL NOT NULL,
    stopped REAL,
    label TEXT NOT NULL DEFAULT '',
    offer_id TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'live',
    end_estimated INTEGER NOT NULL DEFAULT 0,
    stop_sent REAL,
    UNIQUE (provider, instance_id)
);
"""
# Schema 1 had no intent rows: instance ids were NOT NULL and there was no state. Its rows are copied over.
_FROM_V1 = """
ALTER TABLE rentals RENAME TO rentals_v1;
{schema}
INSERT INTO rentals (id, run_id, provider, instance_id, gpu, price_per_hour, started, stopped, state, end_estimated)
    SELECT id, run_id, provider, instance_id, gpu, price_per_hour, started, stopped,
           CASE WHEN stopped IS NULL THEN 'live' ELSE 'ended' END, 0 FROM rentals_v1;
DROP TABLE rentals_v1;
"""
_COLUMNS = (
    "id, run_id, provider, instance_id, gpu, price_per_hour, started, stopped, label, offer_id, state, end_estimated"
)


class LedgerError(RuntimeError):
    """The ledger file cannot be used; the message names the file and what to do."""


class RentalState(StrEnum):
    """Where a rental stands.

    ``CREATING``: written before the create request; the machine may exist (its id is not known yet).
    ``LIVE``: the provider made it. ``TERMINATING``: asked to terminate, the provider has not yet said it is gone.
    ``ENDED``: gone. ``NOT_CREATED``: the create was refused, or no machine with its label turned up.
    """

    CREATING = "creating"
    LIVE = "live"
    TERMINATING = "terminating"
    ENDED = "ended"
    NOT_CREATED = "not_created"


#: The states in which a rental may bill (counted as billing everywhere).
BILLING_STATES = frozenset({RentalState.CREATING, RentalState.LIVE, RentalState.TERMINATING})
#: The states left to settle with the provider (at every start).
UNSETTLED_STATES = frozenset({RentalState.CREATING, RentalState.TERMINATING})


@dataclass(frozen=True)
class Rental:
    """One rented machine (or one attempt to rent it).

    Attributes:
        id: The row's id.
        run_id: The run it was rented for.
        provider: The provider's name (``ProviderName.value``: "runpod", "vast", "lambda").
        instance_id: The provider's id of the machine (None while creating, or when none was made).
        gpu: The GPU's display name.
        price_per_hour: Dollars per hour for the whole machine.
        started: When billing started (unix time): the provider's own time when it reports one.
        stopped: When it stopped (unix time), or None while it may bill.
        label: The machine's name, chosen before the create request.
        offer_id: The offer it was rented from.
        state: Where the rental stands.
        end_estimated: The stop is when Rentune saw it gone, not a time the provider reported.
    """

    id: int
    run_id: str
    provider: str
    instance_id: str | None
    gpu: str
    price_per_hour: float
    started: float
    stopped: float | None
    label: str = ""
    offer_id: str = ""
    state: RentalState = RentalState.LIVE
    end_estimated: bool = False

    @property
    def running(self) -> bool:
        """Whether the machine may still bill (creating, live or terminating)."""
        return self.state in BILLING_STATES

    @property
    def made(self) -> bool:
        """Whether a machine exists or existed for it (every state but ``not_created``)."""
        return self.state is not RentalState.NOT_CREATED

    def end(self, now: float) -> float:
        """When its billing ends: the stop time, or ``now`` while it may bill."""
        return self.stopped if self.stopped is not None else now

    def usd(self, now: float) -> float:
        """Dollars spent up to ``now`` (up to the stop time once stopped): price per hour times rented hours."""
        return self.price_per_hour * max(0.0, self.end(now) - self.started) / 3600

    def usd_between(self, start: float, end: float, now: float) -> float:
        """Dollars spent inside ``[start, end)``: the part of the rental's interval within it."""
        seconds = min(end, self.end(now)) - max(start, self.started)
        return self.price_per_hour * max(0.0, seconds) / 3600


@dataclass(frozen=True)
class CostSummary:
    """What renting has cost, as of ``now``.

    Attributes:
        now: The moment the sums are taken at (unix time).
        total_usd: Dollars over every rental.
        month_usd: Dollars accrued in the current UTC calendar month.
        rentals: Every rental, oldest first.
        running: The rentals still billing, oldest first.
    """

    now: float
    total_usd: float
    month_usd: float
    rentals: tuple[Rental, ...]
    running: tuple[Rental, ...]


def month_bounds(now: float) -> tuple[float, float]:
    """The start and end (unix time) of the UTC calendar month holding ``now``."""
    moment = datetime.fromtimestamp(now, UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    after = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start.timestamp(), after.timestamp()


def _rental(row: tuple[Any, ...]) -> Rental:
    row_id, run_id, provider, instance_id, gpu, price, started, stopped, label, offer_id, state, estimated = row
    return Rental(
        row_id,
        run_id,
        provider,
        instance_id,
        gpu,
        price,
        started,
        stopped,
        label,
        offer_id,
        RentalState(state),
        bool(estimated),
    )


def _use_wal(db: sqlite3.Connection) -> None:
    """Switches the file to write-ahead logging (persistent: readers then never block the writer).

    The switch needs the file to itself, and SQLite answers "locked" at once instead of waiting when another
    connection is switching too, so it is retried for as long as any other write would wait.
    """
    deadline = monotonic() + BUSY_TIMEOUT_S
    while db.execute("PRAGMA journal_mode").fetchall()[0][0] != "wal":
        try:
            db.execute("PRAGMA journal_mode = WAL").fetchall()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or monotonic() > deadline:
                raise
            sleep(0.05)


class Ledger:
    """Records rentals and sums what they cost.

    Args:
        path: The SQLite file; ``ledger.sqlite`` in the data folder by default.

    Raises:
        LedgerError: The file cannot be opened, is not a ledger, or was written by a newer Rentune.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or app_paths().ensure().data_dir / "ledger.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)) as db:
                _use_wal(db)
                self._migrate(db)
        except sqlite3.Error as exc:
            raise LedgerError(
                f"the ledger {self.path} cannot be used ({exc}); check the file and its folder's permissions"
            ) from exc

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Brings the schema to this version; one process at a time (the app, its background and the CLI open it)."""
        db.execute("BEGIN IMMEDIATE")
        try:
            version = int(db.execute("PRAGMA user_version").fetchall()[0][0])
            if version > SCHEMA_VERSION:
                raise LedgerError(
                    f"the ledger {self.path} was written by a newer Rentune (schema {version}); update Rentune"
                )
            if version != SCHEMA_VERSION:
                script = _FROM_V1.format(schema=_SCHEMA) if version == 1 else _SCHEMA
                for statement in script.split(";"):  # not executescript: it would commit the transaction first
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection for one transaction (committed on success), closed afterwards."""
        try:
            with closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)) as db, db:
                yield db
        except sqlite3.Error as exc:
            raise LedgerError(
                f"the ledger {self.path} cannot be used ({exc}); check the file and its folder's permissions"
            ) from exc

    def open(
        self,
        run_id: str,
        provider: str,
        instance_id: str,
        gpu: str,
        price_per_hour: float,
        *,
        started: float | None = None,
        label: str = "",
    ) -> Rental:
        """Records a machine rented now (or at ``started``) and returns its rental (a machine found, not created here).

        An instance is recorded once: opening one already in the ledger returns the rental recorded first.
        """
        with self._db() as db:
            db.execute(
                "INSERT OR IGNORE INTO rentals (run_id, provider, instance_id, gpu, price_per_hour, started, label, "
                "state) VALUES (?, ?, ?, ?, ?, ?, ?, 'live')",
                (run_id, provider, instance_id, gpu, price_per_hour, started or time.time(), label),
            )
        rental = self.get(provider, instance_id)
        assert rental is not None  # just inserted (or already there); rows are never deleted
        return rental

    def intend(  # noqa: PLR0917 - the rental's own fields, in the order of the table
        self, run_id: str, provider: str, label: str, gpu: str, price_per_hour: float, offer_id: str = ""
    ) -> Rental:
        """Records a rental about to be created (state ``creating``): written before the create request is sent."""
        with self._db() as db:
            cursor = db.execute(
                "INSERT INTO rentals (run_id, provider, instance_id, gpu, price_per_hour, started, label, offer_id, "
                "state) VALUES (?, ?, NULL, ?, ?, ?, ?, ?, 'creating')",
                (run_id, provider, gpu, price_per_hour, time.time(), label, offer_id),
            )
            row_id = cursor.lastrowid
        assert row_id is not None
        return self.row(row_id)

    def sending(self, row_id: int) -> None:
        """Moves a ``creating`` row's start to now: its create request goes out (setup such as a key upload is over).

        The start of a machine its provider gives no start time for (Lambda) is then at most one request early.
        """
        with self._db() as db:
            db.execute("UPDATE rentals SET started = ? WHERE id = ? AND state = 'creating'", (time.time(), row_id))

    def created(
        self, row_id: int, instance_id: str, *, price_per_hour: float | None = None, started: float | None = None
    ) -> Rental:
        """Records that the provider made the machine of an intent row (it is ``live`` from here on).

        Args:
            row_id: The intent's row.
            instance_id: The provider's id of the machine.
            price_per_hour: The price it was made at (the intent's price when None).
            started: When it started billing by the provider's clock (the intent's time when None).
        """
        with self._db() as db:
            db.execute(
                "UPDATE rentals SET instance_id = ?, price_per_hour = COALESCE(?, price_per_hour), "
                "started = COALESCE(?, started), stopped = NULL, state = 'live' "
                "WHERE id = ? AND state IN ('creating', 'not_created')",
                (instance_id, price_per_hour, started, row_id),
            )
        return self.row(row_id)

    def not_created(self, row_id: int) -> Rental:
        """Records that an intent made no machine (refused, or none with its label at the provider): no dollars."""
        with self._db() as db:
            db.execute(
                "UPDATE rentals SET state = 'not_created', stopped = started WHERE id = ? AND state = 'creating'",
                (row_id,),
            )
        return self.row(row_id)

    def stop_sent(self, provider: str, instance_id: str, at: float | None = None) -> None:
        """Records that a terminate request for the machine is about to go out (kept across crashes)."""
        with self._db() as db:
            db.execute(
                "UPDATE rentals SET stop_sent = ? WHERE provider = ? AND instance_id = ? AND stopped IS NULL",
                (time.time() if at is None else at, provider, instance_id),
            )

    def last_stop_sent(self, provider: str, instance_id: str) -> float | None:
        """When the last terminate request for the machine went out (None when none did)."""
        with self._db() as db:
            row = db.execute(
                "SELECT stop_sent FROM rentals WHERE provider = ? AND instance_id = ?", (provider, instance_id)
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def terminating(self, provider: str, instance_id: str) -> Rental | None:
        """Records that the machine is being terminated (it bills until the provider says it is gone)."""
        with self._db() as db:
            db.execute(
                "UPDATE rentals SET state = 'terminating' WHERE provider = ? AND instance_id = ? AND state = 'live'",
                (provider, instance_id),
            )
        return self.get(provider, instance_id)

    def close(
        self, provider: str, instance_id: str, stopped: float | None = None, *, estimated: bool | None = None
    ) -> Rental | None:
        """Records that a machine stopped billing now (or at ``stopped``); None when the ledger does not know it.

        Closing twice keeps the first stop time. A stop before the start counts as the start (no negative time).

        Args:
            provider: The provider's name.
            instance_id: The machine.
            stopped: When it stopped; now when None.
            estimated: Whether ``stopped`` is Rentune's own observation rather than the provider's time (by default:
                estimated exactly when no time is given).
        """
        guess = stopped is None if estimated is None else estimated
        with self._db() as db:
            db.execute(
                "UPDATE rentals SET stopped = MAX(?, started), state = 'ended', end_estimated = ? "
                "WHERE provider = ? AND instance_id = ? AND stopped IS NULL",
                (time.time() if stopped is None else stopped, int(guess), provider, instance_id),
            )
        return self.get(provider, instance_id)

    def row(self, row_id: int) -> Rental:
        """One rental by its row id.

        Raises:
            LedgerError: No such row.
        """
        with self._db() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM rentals WHERE id = ?", (row_id,)).fetchone()  # noqa: S608
        if row is None:
            raise LedgerError(f"the ledger {self.path} has no rental {row_id}")
        return _rental(row)

    def unsettled(self) -> list[Rental]:
        """The rentals left to settle with their provider: still ``creating`` or ``terminating``, oldest first."""
        return [rental for rental in self.rentals() if rental.state in UNSETTLED_STATES]

    def get(self, provider: str, instance_id: str) -> Rental | None:
        """The rental of one machine, or None."""
        with self._db() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM rentals WHERE provider = ? AND instance_id = ?",  # noqa: S608 - ours
                (provider, instance_id),
            ).fetchone()
        return None if row is None else _rental(row)

    def rentals(self, run_id: str | None = None) -> list[Rental]:
        """Every rental (or a run's), oldest first."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        with self._db() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM rentals {where} ORDER BY started, id", params)  # noqa: S608
            return [_rental(row) for row in rows]

    def running(self) -> list[Rental]:
        """The rentals that may still bill (creating, live or terminating), oldest first."""
        return [rental for rental in self.rentals() if rental.running]

    def summary(self, now: float | None = None) -> CostSummary:
        """What every rental cost up to ``now`` (the current time by default), in all and this UTC month."""
        now = time.time() if now is None else now
        rentals = tuple(self.rentals())
        start, end = month_bounds(now)
        return CostSummary(
            now=now,
            total_usd=sum(rental.usd(now) for rental in rentals),
            month_usd=sum(rental.usd_between(start, end, now) for rental in rentals),
            rentals=rentals,
            running=tuple(rental for rental in rentals if rental.running),
        )
