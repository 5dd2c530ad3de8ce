"""Bringing work home: checkpoints and the adapter pulled into the run's folder, every path checked.

The machine is not trusted: each name it sends must stay inside the local folder it is written to, and a folder is
complete only once its marker, pulled last, is there.

On a run across several machines each machine holds a part of every checkpoint: the head's files, and what only the
others' ranks wrote (their RNG states; a full fine-tune's shards). The head's part comes as on one machine, then every
other machine's (:class:`CheckpointParts`), each file verified against that machine's own seal, and the marker at home
lists them all: a checkpoint is resumed from only when every part is home.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from desktop.services.billing.activity import mark_activity
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import RemoteError
from desktop.services.platform.files import atomic_write_text
from desktop.services.runs.context import RunContext
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.transfer_log import record_transfer
from trainer_payload.protocol import (
    CHECKPOINT_MARKER,
    CheckpointEvent,
    DoneEvent,
    EventKind,
    UnsafePathError,
    check_relative_path,
)

#: The largest seal another machine may send for its part of a checkpoint (file names and digests).
PART_MARKER_LIMIT = 4 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


class PartMissingError(RemoteError):
    """Another machine's part of a checkpoint cannot be had now (not sealed in time, the machine out of reach)."""


@dataclass(frozen=True)
class CheckpointPart:
    """What another machine of the run wrote into a checkpoint and the head did not (its ranks' own files).

    Attributes:
        machine: That machine's connection.
        remote: The checkpoint's folder there.
        files: Each file's name in the checkpoint, its size and SHA-256, from that machine's seal (:func:`part_files`).
    """

    machine: Machine
    remote: str
    files: dict[str, tuple[int, str]]


class CheckpointParts(Protocol):
    """The other machines of a run, asked for their parts of a checkpoint (:class:`~.nodes.Nodes`)."""

    async def parts(self, path: str, known: Collection[str]) -> list[CheckpointPart]:
        """Every other machine's files of the checkpoint at ``out/<path>`` that are not in ``known``.

        Raises:
            PartMissingError: A part that the checkpoint needs cannot be had now.
            PermanentError: A machine sent a damaged seal or an unsafe name.
        """
        ...


def part_files(seal: bytes, known: Collection[str]) -> dict[str, tuple[int, str]]:
    """The files another machine's seal of a checkpoint lists beyond ``known``: name -> (bytes, SHA-256).

    Raises:
        PermanentError: The seal is not a checkpoint seal, or names a file unsafely (the machine is not trusted).
    """
    try:
        files = json.loads(seal.decode("utf-8"))["files"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise PermanentError("a machine sent a damaged checkpoint seal (not the payload's JSON)") from None
    if not isinstance(files, dict):
        raise PermanentError("a machine sent a damaged checkpoint seal (no list of files)")
    found: dict[str, tuple[int, str]] = {}
    for name, info in files.items():
        if name in known:
            continue
        size, digest = (info.get("bytes"), info.get("sha256")) if isinstance(info, dict) else (None, None)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not _is_digest(digest):
            raise PermanentError(f"a machine's checkpoint seal lists {name!r} without a size and SHA-256")
        if str(name).startswith(CHECKPOINT_MARKER):  # the marker at home is written last, by this computer alone
            raise PermanentError(f"a machine's checkpoint seal lists {name!r}, a name reserved for the seal")
        try:
            check_relative_path(name)
        except UnsafePathError as exc:
            raise PermanentError(f"a machine sent an unsafe path in its checkpoint seal: {exc}") from None
        found[name] = (size, str(digest))
    return found


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


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
    ctx: RunContext,
    run_id: str,
    machine: Machine,
    remote: str,
    local: Path,
    files: dict[str, str],
    parts: Collection[CheckpointPart] = (),
) -> None:
    """Downloads a sealed folder (and the other machines' parts of it); every name must stay inside ``local``."""
    items = [(f"{remote}/{name}", inside(local, name), digest) for name, digest in files.items()]
    mark_activity(ctx.folder(run_id))
    await machine.download_many(items, ctx.progress("download", run_id))
    for part in parts:
        found = [(f"{part.remote}/{name}", inside(local, name), digest) for name, (_, digest) in part.files.items()]
        await part.machine.download_many(found, ctx.progress("download", run_id))
    # The marker goes last: a folder without it is an unfinished pull and is never resumed from.
    if not parts:
        await machine.download(f"{remote}/{CHECKPOINT_MARKER}", local / CHECKPOINT_MARKER)
        return
    head_seal = local / f"{CHECKPOINT_MARKER}.head"
    await machine.download(f"{remote}/{CHECKPOINT_MARKER}", head_seal)
    await asyncio.to_thread(_seal_with_parts, head_seal, parts, local / CHECKPOINT_MARKER)


def _seal_with_parts(head_seal: Path, parts: Collection[CheckpointPart], marker: Path) -> None:
    """Writes the home marker: the head's seal with every other machine's files added (atomically, then)."""
    try:
        seal = json.loads(head_seal.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        seal = None
    listed = seal.get("files") if isinstance(seal, dict) else None
    if not isinstance(listed, dict):
        raise PermanentError("the head sent a damaged checkpoint seal (not the payload's JSON)")
    for part in parts:
        listed.update({name: {"bytes": size, "sha256": digest} for name, (size, digest) in part.files.items()})
    atomic_write_text(marker, json.dumps(seal, indent=1))
    head_seal.unlink()


async def pull_checkpoint(
    ctx: RunContext, run_id: str, machine: Machine, event: CheckpointEvent, others: CheckpointParts | None = None
) -> None:
    """Pulls the checkpoint a ``checkpoint`` event names, unless it is home already; older ones beyond the limit go.

    ``others``: the run's other machines, whose parts of the checkpoint come too (a run across several).

    Raises:
        PermanentError: The event (or another machine's seal) names a path outside the run's checkpoints folder.
    """
    async with ctx.pull_lock:  # "Pull now" and the monitor loop never write the same files at once
        await _pull_checkpoint_locked(ctx, run_id, machine, event, others)


async def _pull_checkpoint_locked(
    ctx: RunContext, run_id: str, machine: Machine, event: CheckpointEvent, others: CheckpointParts | None
) -> None:
    record = ctx.store.get(run_id)
    local_root = inside(ctx.folder(run_id), "checkpoints")
    name = Path(event["path"]).name
    inside(local_root, name)
    if (local_root / name / CHECKPOINT_MARKER).exists():
        return
    try:
        remote = f"{record.remote_dir}/out/{check_relative_path(event['path'])}"
        parts = await others.parts(event["path"], event["sha256"]) if others else []
        started = time.time()
        try:
            await pull_folder(ctx, run_id, machine, remote, local_root / name, event["sha256"], parts)
        finally:  # a failed pull took its time too
            record_transfer(ctx.folder(run_id), started, time.time())
    except (RemoteError, asyncssh.SFTPNoSuchFile, UnsafePathError) as exc:
        ctx.report(f"checkpoint {name} could not be pulled ({exc}); a newer one will be")
        return
    for _step, old in local_checkpoints(local_root)[: -ctx.options.keep_local_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    ctx.report(f"checkpoint {name} is safe on this computer")


async def pull_newest_checkpoint(
    ctx: RunContext, run_id: str, machine: Machine, others: CheckpointParts | None = None
) -> None:
    """Pulls the newest checkpoint the mirrored events name (nothing when none was written), with ``others``' parts."""
    events = await asyncio.to_thread(mirrored_events, ctx.folder(run_id))
    newest = next((e for e in reversed(events) if e["event"] == EventKind.CHECKPOINT), None)
    if newest is not None:
        await pull_checkpoint(ctx, run_id, machine, newest, others)


async def pull_adapter(ctx: RunContext, run_id: str, machine: Machine, event: DoneEvent) -> Path:
    """Pulls the adapter a ``done`` event names into the run's ``adapter`` folder; returns that folder."""
    record = ctx.store.get(run_id)
    local = inside(ctx.folder(run_id), "adapter")
    await pull_folder(ctx, run_id, machine, f"{record.remote_dir}/out/{event['adapter_path']}", local, event["files"])
    return local
