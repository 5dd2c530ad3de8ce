"""The adapters runs brought home, with what each cost and what was exported from it: what the Models page lists.

Every run with an adapter folder on this computer is listed with its base model, size, training time and spend
(:func:`desktop.services.billing.spend.run_spend`), and the exports in its folder under
:func:`desktop.services.local.inventory.exports_root`. Every complete checkpoint a run pulled home (finished, stopped
or failed) is listed too: each is a PEFT adapter of its step, exported into its own folder (``RUN-step-N``).
Export folders whose run has no adapter here any more (the run or its adapter was deleted) are listed on their own,
so nothing on the disk is hidden.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from desktop.core.runs.progress import phase_durations
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger, LedgerError
from desktop.services.billing.spend import priced_usd
from desktop.services.local.common import folder_bytes
from desktop.services.local.inventory import ExportedItem, exports_folder, exports_root, scan_exports
from desktop.services.runs.checkpoints import local_checkpoints
from desktop.services.runs.outputs import ADAPTER_CONFIG, AdapterSource, AdapterSourceError, resolve_adapter
from desktop.services.runs.store import DELETABLE, RunLiveError, RunRecord, RunStore
from trainer_payload.protocol import CHECKPOINT_MARKER


@dataclass(frozen=True)
class ReturnedAdapter:
    """A run's adapter on this computer.

    Attributes:
        run_id: The run it came from.
        source: The adapter folder, its base model and the run's held-out chats.
        bytes: The adapter folder's size.
        finished: When the run last changed (epoch seconds): when the adapter came home, for a finished run.
        trained_seconds: Time the run spent training.
        usd: What the run cost, or None when nothing priced it (an own server without an hourly rate).
        rented: Whether it trained on a rented machine (released after the run: the adapter exists only here).
        target: The machine it trained on (``ssh://user@host:port``), when known.
        remote_dir: The run's folder on that machine, when known.
        ended: Whether the run has ended (only then may its adapter be deleted).
        exports: What was exported from it, in its export folder.
        step: The training step of a checkpoint; None for the run's final adapter.
        state: The run's state (``finished``, ``stopped``, ``failed``...).
    """

    run_id: str
    source: AdapterSource
    bytes: int
    finished: float
    trained_seconds: float
    usd: float | None
    rented: bool
    target: str | None
    remote_dir: str | None
    ended: bool
    exports: tuple[ExportedItem, ...] = ()
    step: int | None = None
    state: str = RunState.FINISHED.value

    @property
    def is_checkpoint(self) -> bool:
        """Whether this is a checkpoint of the run rather than its final adapter."""
        return self.step is not None

    @property
    def export_name(self) -> str:
        """The name of its export folder: the run id, and ``-step-N`` for a checkpoint."""
        return self.run_id if self.step is None else f"{self.run_id}-step-{self.step}"

    @property
    def export_folder(self) -> Path:
        """Where this adapter's exports are written."""
        return exports_folder(self.export_name)


@dataclass(frozen=True)
class Inventory:
    """Everything the Models page lists.

    Attributes:
        adapters: Runs' adapters on this computer, newest first.
        leftovers: Export folder name to its exports, for folders whose run has no adapter here.
    """

    adapters: list[ReturnedAdapter] = field(default_factory=list)
    leftovers: dict[str, list[ExportedItem]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether there is nothing to list."""
        return not self.adapters and not any(self.leftovers.values())

    def all_exports(self) -> list[tuple[ReturnedAdapter | str, ExportedItem]]:
        """Every export with the adapter it came from (a final adapter or a checkpoint), or its folder's name.

        The name stands for an export folder whose adapter is not here any more.
        """
        found: list[tuple[ReturnedAdapter | str, ExportedItem]]
        found = [(adapter, item) for adapter in self.adapters for item in adapter.exports]
        return found + [(name, item) for name, items in self.leftovers.items() for item in items]


def read_inventory(store: RunStore, *, ledger: Ledger | None = None, now: float | None = None) -> Inventory:
    """Lists every returned adapter and every export (blocking: reads the run database and the disk)."""
    now = time.time() if now is None else now
    adapters = [
        adapter
        for record in sorted(store.all(), key=lambda r: r.updated, reverse=True)
        for adapter in _returned(store, record, ledger, now)
    ]
    root = exports_root()
    names = {adapter.export_name for adapter in adapters}
    leftovers = {}
    if root.is_dir():
        for folder in sorted(root.iterdir()):
            if folder.is_dir() and not folder.name.startswith(".") and folder.name not in names:
                items = scan_exports(folder)
                if items:
                    leftovers[folder.name] = items
    return Inventory(adapters, leftovers)


def _returned(store: RunStore, record: RunRecord, ledger: Ledger | None, now: float) -> list[ReturnedAdapter]:
    """The run's final adapter (when home) and its complete adapter checkpoints, newest step first."""
    final = resolve_adapter(record.id, store) if _is_adapter(record.adapter) else None
    checkpoints = [
        (step, source)
        for step, folder in reversed(local_checkpoints(store.folder(record.id) / "checkpoints"))
        if (folder / CHECKPOINT_MARKER).is_file() and (source := _checkpoint_source(record, folder)) is not None
    ]
    if final is None and not checkpoints:
        return []
    transitions = store.transitions(record.id)
    training = sum(s.seconds for s in phase_durations(transitions, now) if s.state is RunState.TRAINING)
    usd, rented = _spend(store, record, ledger, now)

    def adapter(source: AdapterSource, step: int | None) -> ReturnedAdapter:
        name = record.id if step is None else f"{record.id}-step-{step}"
        return ReturnedAdapter(
            run_id=record.id,
            source=source,
            bytes=folder_bytes(source.adapter),
            finished=record.updated,
            trained_seconds=training,
            usd=usd,
            rented=rented,
            target=record.target,
            remote_dir=record.remote_dir,
            ended=record.state in DELETABLE,
            exports=tuple(scan_exports(exports_folder(name))),
            step=step,
            state=record.state.value,
        )

    found = [adapter(final, None)] if final is not None else []
    return found + [adapter(source, step) for step, source in checkpoints]


def _is_adapter(folder: str | None) -> bool:
    return bool(folder) and (Path(str(folder)) / ADAPTER_CONFIG).is_file()


def _checkpoint_source(record: RunRecord, folder: Path) -> AdapterSource | None:
    """A checkpoint as an adapter (the run's base model and held-out chats); None when it holds no adapter.

    A full fine-tune's checkpoints hold whole models, not adapters; a damaged adapter config is not listed either.
    """
    if not _is_adapter(str(folder)):
        return None
    base = record.spec.get("base_model")
    eval_file = record.spec.get("eval_file")
    try:
        from_folder = resolve_adapter(str(folder))
    except AdapterSourceError:
        return None
    return AdapterSource(
        from_folder.adapter,
        base if isinstance(base, str) and base else from_folder.base,
        Path(eval_file) if isinstance(eval_file, str) and eval_file else None,
        record.id,
    )


def _spend(store: RunStore, record: RunRecord, ledger: Ledger | None, now: float) -> tuple[float | None, bool]:
    try:
        return priced_usd(store, record.id, ledger=ledger, now=now)
    except LedgerError:
        return None, True


def delete_adapter(store: RunStore, run_id: str) -> Path:
    """Deletes an ended run's adapter folder and forgets it in the run's record; its exports and checkpoints stay.

    Returns:
        The folder that was deleted.

    Raises:
        UnknownRunError: No such run.
        RunLiveError: The run has not ended (its adapter may still change), or has no adapter here.
        OSError: The folder is outside the runs folder (not Rentune's to delete), or could not be removed.
    """
    record = store.get(run_id)
    if record.state not in DELETABLE:
        raise RunLiveError(f"run {run_id} is {record.state.value}; its adapter can be deleted once the run has ended")
    if not record.adapter:
        raise RunLiveError(f"run {run_id} has no adapter on this computer")
    folder = Path(record.adapter).resolve()
    if store.runs_dir.resolve() not in folder.parents:
        raise OSError(f"{folder} is not in Rentune's runs folder; delete it in your file manager")
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        raise OSError(f"could not delete {folder}; close programs using it and try again")
    store.update(run_id, adapter=None)
    return folder
