"""The money ledger: every rented machine, its price and when it started and stopped, in SQLite.

The file is ``RENTUNE_HOME/data/ledger.sqlite``. The app and a detached ``rentune run`` may write at once, so the
database runs in WAL mode with a busy timeout, and every call opens its own short-lived connection (safe across
threads and processes). A rental is written before its create request (state ``creating``, with the machine's
label), so a machine made by a create whose answer never came is found again by that label. Dollars are the
recorded price per hour times the rented hours, from the provider's own start and end times where it reports them
(else the moments Rentune saw).

A cluster (several machines a provider creates, bills and deletes as one: RunPod's Instant Clusters) has one row per
machine, each at its own price, tied together by ``cluster``: the id the provider creates and terminates (before the
create answers, a placeholder shared by the group). Calls that name a machine by that id act on every row of the
group, and :meth:`Ledger.machines` reads the group back as one rental, the unit the provider acts on.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from time import monotonic, sleep  # apart from time.time, which tests set
from typing import Any

from desktop.services.platform.paths import app_paths

#: The schema this code reads and writes (``PRAGMA user_version``).
SCHEMA_VERSION = 3
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
    cluster TEXT,
    node INTEGER,
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
# Schema 2 had no clusters: every row is a machine of its own.
_FROM_V2 = """
ALTER TABLE rentals ADD COLUMN cluster TEXT;
ALTER TABLE rentals ADD COLUMN node INTEGER
"""
_COLUMNS = (
    "id, run_id, provider, instance_id, gpu, price_per_hour, started, stopped, label, offer_id, state, end_estimated, "
    "cluster, node"
)
# The rows of one machine: its own row, or every row of the cluster it names.
_MACHINE = "provider = ? AND (instance_id = ? OR cluster = ?)"
# The rows of the group a row belongs to (the row alone when it is no cluster's).
_GROUP_OF_ROW = "(id = ? OR cluster = (SELECT cluster FROM rentals WHERE id = ? AND cluster IS NOT NULL))"
#: The prefix of a cluster's placeholder id while its create has not answered.
INTENT_PREFIX = "intent:"


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
        cluster: For a machine of a cluster: the cluster's id at its provider (``intent:...`` until it is known).
        node: For a machine of a cluster: its rank (0: the head).
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
    cluster: str | None = None
    node: int | None = None

    @property
    def machine_id(self) -> str | None:
        """The id its provider creates and terminates it by: its cluster's (once known), else its own."""
        if self.cluster is not None and not self.cluster.startswith(INTENT_PREFIX):
            return self.cluster
        return self.instance_id

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
    row_id, run_id, provider, instance_id, gpu, price, started, stopped, label, offer_id, state, estimated = row[:12]
    cluster, node = row[12:]
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
        cluster,
        node,
    )


def as_machines(rentals: Iterable[Rental]) -> list[Rental]:
    """Rentals as their providers create and terminate them, oldest first: each cluster's rows as one rental."""
    groups: dict[str | int, list[Rental]] = {}
    for index, rental in enumerate(rentals):
        groups.setdefault(rental.cluster or index, []).append(rental)
    return sorted((combined(rows) for rows in groups.values()), key=lambda rental: (rental.started, rental.id))


def cluster_words(machine_gpu: str, machines: int) -> str:
    """A cluster's GPUs from one of its machines' (``8x H100 SXM, machine 1 of 2`` -> ``2 machines x 8x H100 SXM``)."""
    return f"{machines} machines x {machine_gpu.rsplit(', machine ', 1)[0]}"


def combined(rows: list[Rental]) -> Rental:
    """A cluster's rows as one rental, as its provider creates and terminates it (a single machine's row as it is).

    The head's row, named by the cluster's id, at every machine's price together, from the first start to the last
    stop. Money is summed over the rows themselves (each machine may start at its own time).
    """
    head = min(rows, key=lambda row: (row.node or 0, row.id))
    if len(rows) == 1 and head.cluster is None:
        return head
    ends = [row.stopped for row in rows]
    return replace(
        head,
        instance_id=head.machine_id,
        gpu=cluster_words(head.gpu, len(rows)),
        price_per_hour=sum(row.price_per_hour for row in rows),
        started=min(row.started for row in rows),
        stopped=None if None in ends else max(end for end in ends if end is not None),
        end_estimated=any(row.end_estimated for row in rows),
        node=None,
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
                script = {1: _FROM_V1.format(schema=_SCHEMA), 2: _FROM_V2}.get(version, _SCHEMA)
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
        self,
        run_id: str,
        provider: str,
        label: str,
        gpu: str,
        price_per_hour: float,
        offer_id: str = "",
        *,
        nodes: int = 1,
    ) -> Rental:
        """Records a rental about to be created (state ``creating``): written before the create request is sent.

        A cluster of ``nodes`` machines is one row per machine (``gpu`` is each machine's, the price is split
        evenly); what is returned is the group as one rental (:meth:`machine`).
        """
        group = f"{INTENT_PREFIX}{uuid.uuid4().hex}" if nodes > 1 else None
        with self._db() as db:
            ids = [
                db.execute(
                    "INSERT INTO rentals (run_id, provider, instance_id, gpu, price_per_hour, started, label, "
                    "offer_id, state, cluster, node) VALUES (?, ?, NULL, ?, ?, ?, ?, ?, 'creating', ?, ?)",
                    (
                        run_id,
                        provider,
                        gpu if group is None else f"{gpu}, machine {node + 1} of {nodes}",
                        price_per_hour / nodes,
                        time.time(),
                        label,
                        offer_id,
                        group,
                        None if group is None else node,
                    ),
                ).lastrowid
                for node in range(nodes)
            ]
        assert ids[0] is not None
        return self.machine(ids[0])

    def sending(self, row_id: int) -> None:
        """Moves a ``creating`` row's start to now: its create request goes out (setup such as a key upload is over).

        The start of a machine its provider gives no start time for (Lambda) is then at most one request early.
        """
        with self._db() as db:
            db.execute(
                f"UPDATE rentals SET started = ? WHERE {_GROUP_OF_ROW} AND state = 'creating'",  # noqa: S608 - ours
                (time.time(), row_id, row_id),
            )

    def created(
        self, row_id: int, instance_id: str, *, price_per_hour: float | None = None, started: float | None = None
    ) -> Rental:
        """Records that the provider made the machine of an intent row (it is ``live`` from here on).

        For a cluster every machine's row is updated: each is named ``<cluster id>/<rank>`` and costs its share.
        Returns the machine as one rental (:meth:`machine`).

        Args:
            row_id: The intent's row (any row of a cluster's).
            instance_id: The provider's id of the machine (or of the cluster).
            price_per_hour: The price it was made at, for all its machines (the intent's price when None).
            started: When it started billing by the provider's clock (the intent's time when None).
        """
        with self._db() as db:
            rows = self._group(db, row_id)
            for row in rows:
                grouped = row.cluster is not None
                db.execute(
                    "UPDATE rentals SET instance_id = ?, cluster = ?, price_per_hour = COALESCE(?, price_per_hour), "
                    "started = COALESCE(?, started), stopped = NULL, state = 'live' "
                    "WHERE id = ? AND state IN ('creating', 'not_created')",
                    (
                        f"{instance_id}/{row.node}" if grouped else instance_id,
                        instance_id if grouped else None,
                        None if price_per_hour is None else price_per_hour / len(rows),
                        started,
                        row.id,
                    ),
                )
        return self.machine(row_id)

    def not_created(self, row_id: int) -> Rental:
        """Records that an intent made no machine (refused, or none with its label at the provider): no dollars."""
        with self._db() as db:
            db.execute(
                f"UPDATE rentals SET state = 'not_created', stopped = started WHERE {_GROUP_OF_ROW} "  # noqa: S608
                "AND state = 'creating'",
                (row_id, row_id),
            )
        return self.machine(row_id)

    def stop_sent(self, provider: str, instance_id: str, at: float | None = None) -> None:
        """Records that a terminate request for the machine is about to go out (kept across crashes)."""
        with self._db() as db:
            db.execute(
                f"UPDATE rentals SET stop_sent = ? WHERE {_MACHINE} AND stopped IS NULL",  # noqa: S608 - ours
                (time.time() if at is None else at, provider, instance_id, instance_id),
            )

    def last_stop_sent(self, provider: str, instance_id: str) -> float | None:
        """When the last terminate request for the machine went out (None when none did)."""
        with self._db() as db:
            row = db.execute(
                f"SELECT MAX(stop_sent) FROM rentals WHERE {_MACHINE}",  # noqa: S608 - ours
                (provider, instance_id, instance_id),
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def terminating(self, provider: str, instance_id: str) -> Rental | None:
        """Records that the machine is being terminated (it bills until the provider says it is gone)."""
        with self._db() as db:
            db.execute(
                f"UPDATE rentals SET state = 'terminating' WHERE {_MACHINE} AND state = 'live'",  # noqa: S608 - ours
                (provider, instance_id, instance_id),
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
                "UPDATE rentals SET stopped = MAX(?, started), state = 'ended', end_estimated = ? "  # noqa: S608
                f"WHERE {_MACHINE} AND stopped IS NULL",
                (time.time() if stopped is None else stopped, int(guess), provider, instance_id, instance_id),
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

    def machine(self, row_id: int) -> Rental:
        """The machine a row belongs to, as one rental: the row itself, or its whole cluster (:func:`combined`).

        Raises:
            LedgerError: No such row.
        """
        with self._db() as db:
            rows = self._group(db, row_id)
        if not rows:
            raise LedgerError(f"the ledger {self.path} has no rental {row_id}")
        return combined(rows)

    @staticmethod
    def _group(db: sqlite3.Connection, row_id: int) -> list[Rental]:
        query = f"SELECT {_COLUMNS} FROM rentals WHERE {_GROUP_OF_ROW} ORDER BY node, id"  # noqa: S608 - ours
        return [_rental(row) for row in db.execute(query, (row_id, row_id))]

    def unsettled(self) -> list[Rental]:
        """The machines left to settle with their provider: still ``creating`` or ``terminating``, oldest first."""
        return [rental for rental in self.machines() if rental.state in UNSETTLED_STATES]

    def get(self, provider: str, instance_id: str) -> Rental | None:
        """The rental of one machine (named by a cluster's id: the cluster, as one rental), or None."""
        with self._db() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM rentals WHERE {_MACHINE} ORDER BY node, id",  # noqa: S608 - ours
                (provider, instance_id, instance_id),
            ).fetchall()
        found = [_rental(row) for row in rows]
        own = [row for row in found if row.instance_id == instance_id]
        return own[0] if own else (combined(found) if found else None)

    def rentals(self, run_id: str | None = None) -> list[Rental]:
        """Every rental (or a run's), oldest first: one per machine, each machine of a cluster apart."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        with self._db() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM rentals {where} ORDER BY started, id",  # noqa: S608 - ours
                params,
            )
            return [_rental(row) for row in rows]

    def machines(self, run_id: str | None = None) -> list[Rental]:
        """What the providers create and terminate, oldest first: each machine, and each cluster as one rental."""
        return as_machines(self.rentals(run_id))

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
