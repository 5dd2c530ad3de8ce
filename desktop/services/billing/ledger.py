"""The money ledger: every rented machine, its price and when it started and stopped, in SQLite.

The file is ``RENTUNE_HOME/data/ledger.sqlite``. The app and a detached ``rentune run`` may write at once, so the
database runs in WAL mode with a busy timeout, and every call opens its own short-lived connection (safe across
threads and processes). Dollars are an estimate from the recorded price per hour, not the provider's bill.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from desktop.services.platform.paths import app_paths

#: The schema this code reads and writes (``PRAGMA user_version``).
SCHEMA_VERSION = 1
#: Seconds a writer waits for another process's transaction before giving up.
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rentals (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    gpu TEXT NOT NULL,
    price_per_hour REAL NOT NULL,
    started REAL NOT NULL,
    stopped REAL,
    UNIQUE (provider, instance_id)
);
"""
_COLUMNS = "id, run_id, provider, instance_id, gpu, price_per_hour, started, stopped"


class LedgerError(RuntimeError):
    """The ledger file cannot be used; the message names the file and what to do."""


@dataclass(frozen=True)
class Rental:
    """One rented machine.

    Attributes:
        id: The row's id.
        run_id: The run it was rented for.
        provider: The provider's name (``ProviderName.value``: "runpod", "vast", "lambda").
        instance_id: The provider's id of the machine.
        gpu: The GPU's display name.
        price_per_hour: Dollars per hour for the whole machine.
        started: When billing started (unix time).
        stopped: When it stopped (unix time), or None while it runs.
    """

    id: int
    run_id: str
    provider: str
    instance_id: str
    gpu: str
    price_per_hour: float
    started: float
    stopped: float | None

    @property
    def running(self) -> bool:
        """Whether the machine is still rented (and billing)."""
        return self.stopped is None

    def end(self, now: float) -> float:
        """When its billing ends: the stop time, or ``now`` while it runs."""
        return self.stopped if self.stopped is not None else now

    def usd(self, now: float) -> float:
        """Dollars spent up to ``now`` (up to the stop time once stopped)."""
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


def _rental(row: tuple[int, str, str, str, str, float, float, float | None]) -> Rental:
    return Rental(*row)


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
        with self._db() as db:
            self._migrate(db)

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"the ledger {self.path} was written by a newer Rentune (schema {version}); update Rentune"
            )
        db.execute("PRAGMA journal_mode = WAL")  # persistent: readers no longer block the writer
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

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
    ) -> Rental:
        """Records a machine rented now (or at ``started``) and returns its rental.

        An instance is recorded once: opening one already in the ledger returns the rental recorded first.
        """
        with self._db() as db:
            db.execute(
                "INSERT OR IGNORE INTO rentals (run_id, provider, instance_id, gpu, price_per_hour, started) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, provider, instance_id, gpu, price_per_hour, time.time() if started is None else started),
            )
        rental = self.get(provider, instance_id)
        assert rental is not None  # just inserted (or already there); rows are never deleted
        return rental

    def close(self, provider: str, instance_id: str, stopped: float | None = None) -> Rental | None:
        """Records that a machine stopped billing now (or at ``stopped``); None when the ledger does not know it.

        Closing twice keeps the first stop time. A stop before the start counts as the start (no negative time).
        """
        with self._db() as db:
            db.execute(
                "UPDATE rentals SET stopped = MAX(?, started) "
                "WHERE provider = ? AND instance_id = ? AND stopped IS NULL",
                (time.time() if stopped is None else stopped, provider, instance_id),
            )
        return self.get(provider, instance_id)

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
        """The rentals still billing, oldest first."""
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
