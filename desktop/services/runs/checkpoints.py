"""Bringing work home: checkpoints and the adapter pulled into the run's folder, every path checked.

The machine is not trusted: each name it sends must stay inside the local folder it is written to, and a folder is
complete only once its marker, pulled last, is there.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import asyncssh

from desktop.services.billing.activity import mark_activity
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import RemoteError
from desktop.services.runs.context import RunContext
from desktop.services.runs.events import mirrored_events
from trainer_payload.protocol import (
    CHECKPOINT_MARKER,
    CheckpointEvent,
    DoneEvent,
    EventKind,
    UnsafePathError,
    check_relative_path,
)


def inside(folder: Path, name: str) -> Path:
    """``folder / name`` when it stays inside ``folder`` (links on this computer followed).

    Raises:
        PermanentError: ``name`` is not a plain relative path, or leads out of the folder.
    """
    try:
        check_relative_path(name)
    except UnsafePathError as exc:
        raise PermanentError(f"the machine sent an unsafe path: {exc}") from None
    target = folder / name
    if not target.resolve().is_relative_to(folder.resolve()):
        raise PermanentError(f"the machine sent an unsafe path: {name!r} leads out of {folder} through a link")
    return target


def local_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The checkpoint folders under ``root`` with their steps, oldest first (complete or not)."""
    if not root.is_dir():
        return []
    found = [(int(p.name.split("-")[1]), p) for p in root.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    return sorted(found)


def newest_local_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (None when there is none)."""
    complete = [p for _s, p in local_checkpoints(root) if (p / CHECKPOINT_MARKER).exists()]
    return complete[-1] if complete else None


async def pull_folder(  # noqa: PLR0917 - who pulls, from where, to where, what
    ctx: RunContext, run_id: str, machine: Machine, remote: str, local: Path, files: dict[str, str]
) -> None:
    """Downloads a sealed folder; every file name must stay inside ``local`` (the machine is not trusted)."""
    items = [(f"{remote}/{name}", inside(local, name), digest) for name, digest in files.items()]
    mark_activity(ctx.folder(run_id))
    await machine.download_many(items, ctx.progress("download", run_id))
    # The marker goes last: a folder without it is an unfinished pull and is never resumed from.
    await machine.download(f"{remote}/{CHECKPOINT_MARKER}", local / CHECKPOINT_MARKER)


async def pull_checkpoint(ctx: RunContext, run_id: str, machine: Machine, event: CheckpointEvent) -> None:
    """Pulls the checkpoint a ``checkpoint`` event names, unless it is home already; older ones beyond the limit go.

    Raises:
        PermanentError: The event names a path outside the run's checkpoints folder.
    """
    async with ctx.pull_lock:  # "Pull now" and the monitor loop never write the same files at once
        await _pull_checkpoint_locked(ctx, run_id, machine, event)


async def _pull_checkpoint_locked(ctx: RunContext, run_id: str, machine: Machine, event: CheckpointEvent) -> None:
    record = ctx.store.get(run_id)
    local_root = inside(ctx.folder(run_id), "checkpoints")
    name = Path(event["path"]).name
    inside(local_root, name)
    if (local_root / name / CHECKPOINT_MARKER).exists():
        return
    try:
        remote = f"{record.remote_dir}/out/{event['path']}"
        await pull_folder(ctx, run_id, machine, remote, local_root / name, event["sha256"])
    except (RemoteError, asyncssh.SFTPNoSuchFile) as exc:
        ctx.report(f"checkpoint {name} could not be pulled ({exc}); a newer one will be")
        return
    for _step, old in local_checkpoints(local_root)[: -ctx.options.keep_local_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    ctx.report(f"checkpoint {name} is safe on this computer")


async def pull_newest_checkpoint(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Pulls the newest checkpoint the mirrored events name (nothing when none was written)."""
    events = await asyncio.to_thread(mirrored_events, ctx.folder(run_id))
    newest = next((e for e in reversed(events) if e["event"] == EventKind.CHECKPOINT), None)
    if newest is not None:
        await pull_checkpoint(ctx, run_id, machine, newest)


async def pull_adapter(ctx: RunContext, run_id: str, machine: Machine, event: DoneEvent) -> Path:
    """Pulls the adapter a ``done`` event names into the run's ``adapter`` folder; returns that folder."""
    record = ctx.store.get(run_id)
    local = inside(ctx.folder(run_id), "adapter")
    await pull_folder(ctx, run_id, machine, f"{record.remote_dir}/out/{event['adapter_path']}", local, event["files"])
    return local
