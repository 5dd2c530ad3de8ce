"""Everything shown about a run besides its events, read in one go: record, history, spend and files at home.

The monitor and the runs list read a :class:`RunSnapshot` in a worker thread (every read here blocks: SQLite and
small file reads), so the event loop stays free while a run streams its events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger, LedgerError
from desktop.services.billing.spend import RunSpend, run_spend
from desktop.services.runs.checkpoints import local_checkpoints
from desktop.services.runs.store import RunRecord, RunStore
from desktop.services.runs.transfer import UploadProgress, read_upload_progress
from trainer_payload.protocol import CHECKPOINT_MARKER, TENSORBOARD_DIR_NAME, TRACKIO_DIR_NAME


@dataclass(frozen=True)
class LocalFiles:
    """What of a run is on this computer.

    Attributes:
        checkpoint_steps: The steps of the complete checkpoints brought home, oldest first.
        adapter: The adapter (or model) folder once it is home and verified, else None.
        tensorboard: The newest TensorBoard event files at home (a run with ``[tracking]``): the adapter's once it is
            home, else the newest complete checkpoint's; None without any.
        trackio: The newest trackio database's folder at home, found the same way.
    """

    checkpoint_steps: tuple[int, ...]
    adapter: Path | None
    tensorboard: Path | None = None
    trackio: Path | None = None

    def tracker_logs(self, tracker: str) -> Path | None:
        """The newest logs at home of ``tracker`` (``tensorboard`` or ``trackio``)."""
        return {TENSORBOARD_DIR_NAME: self.tensorboard, TRACKIO_DIR_NAME: self.trackio}.get(tracker)


@dataclass(frozen=True)
class RunSnapshot:
    """One reading of a run.

    Attributes:
        record: The run's record.
        transitions: Its state history, oldest first (``ts``, ``from_state``, ``to_state``, ``note``).
        spend: What it cost so far (None when the ledger cannot be read now; ``spend_problem`` says why).
        spend_problem: Why ``spend`` is missing.
        files: What of it is home.
        upload: How far its latest upload got (read only while it uploads).
        now: When it was read (epoch seconds): costs and durations are as of then.
        nodes: The run's other machines, in rank order, when it trains on several (empty on one).
    """

    record: RunRecord
    transitions: list[dict[str, Any]]
    spend: RunSpend | None
    spend_problem: str
    files: LocalFiles
    upload: UploadProgress | None
    now: float
    nodes: tuple[RunRecord, ...] = ()


def local_files(store: RunStore, record: RunRecord) -> LocalFiles:
    """The complete checkpoints and the verified adapter of a run on this computer (blocking: lists its folder)."""
    root = store.runs_dir / record.id / "checkpoints"
    complete = [path for _step, path in local_checkpoints(root) if (path / CHECKPOINT_MARKER).exists()]
    steps = tuple(step for step, path in local_checkpoints(root) if path in complete)
    adapter = Path(record.adapter) if record.adapter and Path(record.adapter).is_dir() else None
    sealed = [*complete, *([adapter] if adapter else [])]
    return LocalFiles(steps, adapter, _newest(sealed, TENSORBOARD_DIR_NAME), _newest(sealed, TRACKIO_DIR_NAME))


def _newest(sealed: list[Path], name: str) -> Path | None:
    """The newest sealed folder's ``name`` subfolder, if any holds one."""
    return next((folder / name for folder in reversed(sealed) if (folder / name).is_dir()), None)


def read_snapshot(store: RunStore, run_id: str, ledger: Ledger | None = None) -> RunSnapshot:
    """Reads the run's record, history, spend and local files (blocking).

    Raises:
        UnknownRunError: No such run.
        sqlite3.Error, OSError: The run database cannot be read now.
    """
    now = time.time()
    record = store.get(run_id)
    transitions = store.transitions(run_id)
    try:
        spend, problem = run_spend(store, run_id, ledger=ledger, now=now), ""
    except LedgerError as exc:
        spend, problem = None, str(exc)
    upload = read_upload_progress(store.runs_dir / run_id) if record.state is RunState.UPLOADING else None
    nodes = tuple(store.nodes_of(record.id))
    return RunSnapshot(record, transitions, spend, problem, local_files(store, record), upload, now, nodes)


@dataclass(frozen=True)
class Footprint:
    """What deleting a run's files removes from this computer, in bytes.

    Attributes:
        adapter_bytes: The trained adapter (or model) folder (0 when none came home).
        checkpoints: How many checkpoint folders there are.
        checkpoint_bytes: Their size together.
        total_bytes: Everything in the run's folder (the event log, the job, the above).
    """

    adapter_bytes: int
    checkpoints: int
    checkpoint_bytes: int
    total_bytes: int


def footprint(store: RunStore, record: RunRecord) -> Footprint:
    """The sizes of what the run keeps on this computer (blocking: walks its folder)."""
    folder = store.runs_dir / record.id
    adapter = Path(record.adapter) if record.adapter else None
    checkpoints = [path for _step, path in local_checkpoints(folder / "checkpoints")]
    return Footprint(
        _size(adapter) if adapter is not None else 0,
        len(checkpoints),
        sum(_size(path) for path in checkpoints),
        _size(folder),
    )


def _size(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:  # removed while counting
            continue
    return total
