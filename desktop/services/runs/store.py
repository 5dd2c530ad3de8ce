"""Runs persisted in SQLite (``RENTUNE_HOME/data/runs.db``), written before every transition.

Each run also has a folder (``data/runs/RUN_ID``) holding its spec copy, the mirrored event stream, pulled
checkpoints and the final adapter. No secret is ever stored here: errors and transition notes pass the redactor
(:func:`~desktop.services.platform.logs.redact_known`) on their way in.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.runs.states import TERMINAL, RunState, check_transition
from desktop.services.platform.logs import redact_known
from desktop.services.platform.paths import app_paths

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,
    target TEXT,
    host_key TEXT,
    fingerprint TEXT,
    remote_dir TEXT,
    pid INTEGER,
    events_offset INTEGER NOT NULL DEFAULT 0,
    last_seq INTEGER NOT NULL DEFAULT 0,
    relaunches INTEGER NOT NULL DEFAULT 0,
    started REAL NOT NULL,
    updated REAL NOT NULL,
    adapter TEXT,
    error TEXT
);
CREATE TABLE IF NOT EXISTS run_keys (
    run_id TEXT NOT NULL,
    target TEXT NOT NULL,
    public_key TEXT NOT NULL,
    authorized_keys TEXT NOT NULL,
    host_key TEXT,
    identity TEXT,
    since REAL NOT NULL,
    PRIMARY KEY (run_id, target)
);
CREATE TABLE IF NOT EXISTS transitions (
    run_id TEXT NOT NULL,
    ts REAL NOT NULL,
    from_state TEXT,
    to_state TEXT NOT NULL,
    note TEXT
);
"""


#: Runs whose local files may be deleted: nothing follows them any more.
DELETABLE = frozenset({*TERMINAL, RunState.FAILED})


#: Separates a run's id from the rank of one of its other machines (``20261205-101500-ab12.n1``).
NODE_ID_MARK = ".n"
_INSERT_RUN = "INSERT INTO runs (id, state, spec, target, started, updated) VALUES (?, ?, ?, ?, ?, ?)"
_ID_TRIES = 100


def _insert_with_fresh_id(db: sqlite3.Connection, stamp: str, row: tuple[Any, ...]) -> str:
    """Inserts ``row`` (every column after ``id``) under ``stamp`` plus 4 random hex digits, unused, and returns the id.

    Runs created within one second (a sweep, a scripted batch) share the stamp, so the suffix is drawn again
    while it is taken (by this or another process) rather than failing the run on a one-in-65,536 clash.
    """
    for _ in range(_ID_TRIES):
        run_id = stamp + secrets.token_hex(2)
        try:
            db.execute(_INSERT_RUN, (run_id, *row))
        except sqlite3.IntegrityError:
            if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise
            continue
        return run_id
    raise RuntimeError(f"no free run id under {stamp} after {_ID_TRIES} tries")


class UnknownRunError(LookupError):
    """No run has that id (or unique prefix)."""


class RunLiveError(RuntimeError):
    """The run is still live (or paused, and so resumable); its files are needed."""


@dataclass(frozen=True)
class RunRecord:
    """One row of the runs table."""

    id: str
    state: RunState
    spec: dict[str, Any]
    target: str | None
    host_key: str | None
    fingerprint: str | None
    remote_dir: str | None
    pid: int | None
    events_offset: int
    last_seq: int
    relaunches: int
    started: float
    updated: float
    adapter: str | None
    error: str | None


@dataclass(frozen=True)
class InstalledKey:
    """A run's public key that is (or may be) in a machine's authorized keys: remembered until it is removed.

    Attributes:
        run_id: The run the key belongs to (its record may be deleted since).
        target: The machine, ``ssh://user@host:port``.
        public_key: The key line.
        authorized_keys: The file it was added to, as the spec gave it.
        host_key: The machine's pinned host key when the key was installed (a later cleanup checks it).
        identity: The user's own key file for that machine, to log in when the run's key is gone.
        since: When it was installed (epoch seconds).
    """

    run_id: str
    target: str
    public_key: str
    authorized_keys: str
    host_key: str | None
    identity: str | None
    since: float


class RunStoreError(sqlite3.DatabaseError):
    """The run database cannot be used; the message names the file and the fix."""


class RunStore:
    """Reads and writes runs; every write is its own committed transaction.

    Raises:
        RunStoreError: The database file cannot be opened or is not a run database.
    """

    def __init__(self, path: Path | None = None) -> None:
        paths = app_paths()
        self.path = path or paths.data_dir / "runs.db"
        self.runs_dir = paths.runs_dir
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._db() as db:
                db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise RunStoreError(
                f"the run database {self.path} cannot be used ({exc}); move it aside (Rentune starts a new one) "
                "or check its permissions"
            ) from exc

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=30)) as db, db:
            db.row_factory = sqlite3.Row
            yield db

    def folder(self, run_id: str) -> Path:
        """The run's local folder (created)."""
        folder = self.runs_dir / run_id
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def create(
        self, spec: dict[str, Any], target: str | None, *, node_of: str | None = None, rank: int = 0
    ) -> RunRecord:
        """Records a new run in ``planned`` state.

        ``node_of``: the record is one more machine (of ``rank``) of that run across several: its id is the run's
        with ``.n<rank>``, and it is listed only with the run (:meth:`nodes_of`), never as a run of its own.
        """
        now = time.time()
        row = (RunState.PLANNED.value, json.dumps(spec), target, now, now)
        with self._db() as db:
            if node_of:
                run_id = f"{node_of}{NODE_ID_MARK}{rank}"
                db.execute(_INSERT_RUN, (run_id, *row))
            else:
                run_id = _insert_with_fresh_id(db, time.strftime("%Y%m%d-%H%M%S-"), row)
            db.execute("INSERT INTO transitions VALUES (?, ?, NULL, ?, 'created')", (run_id, now, "planned"))
        self.folder(run_id)
        return self.get(run_id)

    def record_finished(self, spec: dict[str, Any], *, started: float, trained: tuple[float, float]) -> RunRecord:
        """Records a run that already happened on this computer (a trial), finished.

        It was planned at ``started`` and trained over ``trained`` (start and end). Its adapter is set with
        :meth:`update` once it is in the run's folder.
        """
        stamp = time.strftime("%Y%m%d-%H%M%S-", time.localtime(started))
        rows = [(started, None, RunState.PLANNED), (trained[0], RunState.PLANNED, RunState.TRAINING)]
        rows.append((trained[1], RunState.TRAINING, RunState.FINISHED))
        with self._db() as db:
            run_id = _insert_with_fresh_id(
                db, stamp, (RunState.FINISHED.value, json.dumps(spec), None, started, trained[1])
            )
            for ts, before, after in rows:
                note = "created" if before is None else ""
                db.execute(
                    "INSERT INTO transitions VALUES (?, ?, ?, ?, ?)",
                    (run_id, ts, None if before is None else before.value, after.value, note),
                )
        self.folder(run_id)
        return self.get(run_id)

    def get(self, run_id: str) -> RunRecord:
        """A run by id or unique id prefix.

        Raises:
            UnknownRunError: None or several match; the message says which.
        """
        with self._db() as db:
            rows = (
                db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchall()
                or db.execute(
                    "SELECT * FROM runs WHERE id LIKE ? AND id NOT LIKE ? ORDER BY started",
                    (run_id + "%", f"%{NODE_ID_MARK}%"),
                ).fetchall()
            )
        if len(rows) != 1:
            reason = "no run matches" if not rows else f"{len(rows)} runs match"
            raise UnknownRunError(f"{reason} {run_id!r}; see rentune runs")
        return _record(rows[0])

    def all(self, *, with_nodes: bool = False) -> list[RunRecord]:
        """Every run, oldest first; the other machines of runs across several only ``with_nodes``."""
        with self._db() as db:
            records = [_record(row) for row in db.execute("SELECT * FROM runs ORDER BY started")]
        return [r for r in records if with_nodes or NODE_ID_MARK not in r.id]

    def nodes_of(self, run_id: str) -> list[RunRecord]:
        """The other machines of a run across several, in rank order (empty for a run on one machine)."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM runs WHERE id LIKE ?", (f"{run_id}{NODE_ID_MARK}%",)).fetchall()
        return sorted((_record(row) for row in rows), key=lambda r: int(r.id.rsplit(NODE_ID_MARK, 1)[1]))

    def transition(self, run_id: str, state: RunState, note: str = "", *, reopen: bool = False) -> RunRecord:
        """Moves a run to ``state`` and records the transition with the time.

        ``reopen`` lets the user's resume take up a stopped run again (see :func:`check_transition`). The note is
        redacted before it is written.
        """
        note = redact_known(note)
        current = self.get(run_id)
        check_transition(current.state, state, reopen=reopen)
        now = time.time()
        with self._db() as db:
            db.execute("UPDATE runs SET state = ?, updated = ? WHERE id = ?", (state.value, now, run_id))
            db.execute(
                "INSERT INTO transitions VALUES (?, ?, ?, ?, ?)", (run_id, now, current.state.value, state.value, note)
            )
        return self.get(run_id)

    def update(self, run_id: str, **fields: Any) -> RunRecord:
        """Sets columns of a run in one statement (not its state: use :meth:`transition`); ``spec`` is a dict.

        An ``error`` is redacted before it is written.
        """
        if "state" in fields:
            raise ValueError("use transition() to change the state")
        if fields.get("error"):
            fields["error"] = redact_known(str(fields["error"]))
        if "spec" in fields:
            fields["spec"] = json.dumps(fields["spec"])
        names = ", ".join(f"{name} = ?" for name in fields)
        with self._db() as db:
            db.execute(
                f"UPDATE runs SET {names}, updated = ? WHERE id = ?",  # noqa: S608 - column names are ours
                (*fields.values(), time.time(), run_id),
            )
        return self.get(run_id)

    def delete(self, run_id: str) -> None:
        """Forgets a run that has ended: removes its folder (checkpoints, adapter, events) and its record.

        Raises:
            UnknownRunError: No run has that id.
            RunLiveError: The run is not finished, cancelled or failed; nothing was removed.
        """
        record = self.get(run_id)
        if record.id != run_id:
            raise UnknownRunError(f"give the whole run id to delete a run ({record.id}), not a prefix")
        if record.state not in DELETABLE:
            raise RunLiveError(
                f"run {run_id} is {record.state.value}; stop it (or let it finish) before deleting its files"
            )
        for folder_id in [node.id for node in self.nodes_of(run_id)] + [run_id]:  # the head's record goes last
            shutil.rmtree(self.runs_dir / folder_id, ignore_errors=True)
            if (self.runs_dir / folder_id).exists():
                raise OSError(f"could not remove {self.runs_dir / folder_id}; close programs using it and try again")
            with self._db() as db:
                db.execute("DELETE FROM transitions WHERE run_id = ?", (folder_id,))
                db.execute("DELETE FROM runs WHERE id = ?", (folder_id,))

    def remember_key(self, key: InstalledKey) -> None:
        """Records a run key about to be installed on a machine (before the install, so a lost answer is covered)."""
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO run_keys VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key.run_id, key.target, key.public_key, key.authorized_keys, key.host_key, key.identity, key.since),
            )

    def forget_key(self, run_id: str, target: str) -> None:
        """Drops a run key from the record once it was removed from the machine."""
        with self._db() as db:
            db.execute("DELETE FROM run_keys WHERE run_id = ? AND target = ?", (run_id, target))

    def installed_keys(self, target: str | None = None, run_id: str | None = None) -> list[InstalledKey]:
        """Run keys still installed on machines (all, or on one target, or of one run), oldest first."""
        query, values = "SELECT * FROM run_keys WHERE 1 = 1", []
        for column, value in (("target", target), ("run_id", run_id)):
            if value is not None:
                query += f" AND {column} = ?"
                values.append(value)
        with self._db() as db:
            rows = db.execute(query + " ORDER BY since", values).fetchall()
        return [InstalledKey(**dict(row)) for row in rows]

    def transitions(self, run_id: str) -> list[dict[str, Any]]:
        """The run's history: every transition with time and note."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM transitions WHERE run_id = ? ORDER BY ts, rowid", (run_id,))
            return [dict(row) for row in rows]


def _record(row: sqlite3.Row) -> RunRecord:
    data = dict(row)
    data["state"] = RunState(data["state"])
    data["spec"] = json.loads(data["spec"])
    return RunRecord(**data)
