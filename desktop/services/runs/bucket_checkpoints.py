"""A run's checkpoints through its bucket: from the machine straight to the bucket, and back to a new machine.

With a bucket (see :mod:`desktop.services.runs.bucket_data`), each sealed checkpoint goes from the machine to the
bucket as the app follows the run: the app starts the uploads and presigns their parts, the machine sends them
(``python -m trainer_payload push``, the plan on its stdin; no bucket key on the machine), the app completes them and
writes the seal last. Adapters of LoRA and QLoRA runs still come home too; a full fine-tune's checkpoints, too large
for a laptop's link, stay in the bucket. A resume on a new machine fetches the bucket's newest whole checkpoint when
it is newer than the one at home.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from typing import Any

from desktop.core.storage import StorageError, StorageSettings
from desktop.services.buckets.checkpoints import (
    CheckpointUpload,
    abort_checkpoint_upload,
    begin_checkpoint_upload,
    finish_checkpoint_upload,
    newest_checkpoint_links,
)
from desktop.services.buckets.client import BucketError, bucket_keys
from desktop.services.buckets.inventory import delete_run, prune_bucket
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import RemoteError
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs import bucket_courier
from desktop.services.runs.bucket_data import BUCKET_KEY, FETCH_SECONDS, fetch_on_machine, last_json
from desktop.services.runs.checkpoints import part_files
from desktop.services.runs.context import RunContext
from desktop.services.runs.store import RunRecord
from trainer_payload.protocol import CHECKPOINT_MARKER, CheckpointEvent, UnsafePathError, check_relative_path

#: The methods whose checkpoints stay in the bucket (the whole model: too large to pull home while training).
BUCKET_ONLY_METHODS = frozenset({"full", "full-8bit"})


def stays_in_bucket(spec: dict[str, Any]) -> bool:
    """Whether a run's checkpoints stay in its bucket instead of coming home.

    A full fine-tune's do, with a bucket, unless the Storage settings ask them home (``full_checkpoints_home``).
    """
    bucket = spec.get(BUCKET_KEY)
    if not bucket or bucket.get("full_checkpoints_home"):
        return False
    return spec["training"].get("method", "qlora") in BUCKET_ONLY_METHODS


async def keep_in_bucket(
    ctx: RunContext, run_id: str, machine: Machine, event: CheckpointEvent, *, total: int | None, poll: float
) -> bool:
    """Sees the checkpoint the event names into the run's bucket; whether it is whole there now.

    When the links handed to the machine cover it, the machine's courier sends it (the app waits for its receipt and
    checks the bucket); otherwise, or when the courier could not, the app has the machine push it. Once it is there,
    older ones are pruned and the links ahead are renewed from it. Never raises for the bucket's or the machine's
    sake: the run goes on, says why, and the checkpoint is pulled home as without a bucket.
    """
    if not ctx.store.get(run_id).spec.get(BUCKET_KEY):
        return False
    name = event["path"].rsplit("/", 1)[-1]
    try:
        folder = f"out/{check_relative_path(event['path'])}"
        seal = await _read_seal(machine, f"{ctx.store.get(run_id).remote_dir}/{folder}")
    except (ValueError, RemoteError, UnsafePathError) as exc:
        ctx.report(f"checkpoint {name} did not go to the bucket ({exc})")
        return False
    sent = bucket_courier.covers(ctx, run_id, name) and await bucket_courier.sent_by_courier(
        ctx, run_id, machine, name, poll
    )
    if not sent and not await push_checkpoint(ctx, run_id, machine, name=name, folder=folder, seal=seal):
        return False
    await _prune(ctx, run_id)
    sizes = bucket_courier.seal_sizes(seal)
    await bucket_courier.hand_out(ctx, run_id, machine, step=event["step"], sizes=sizes, total=total)
    return True


async def push_checkpoint(
    ctx: RunContext, run_id: str, machine: Machine, *, name: str, folder: str, seal: bytes
) -> bool:
    """Has the machine push the sealed checkpoint in ``folder`` to the run's bucket, the app completing the uploads.

    Whether it is whole there now; a failure is said and every unfinished upload aborted.
    """
    record = ctx.store.get(run_id)
    try:
        storage = StorageSettings.model_validate(record.spec[BUCKET_KEY])
        sizes = bucket_courier.seal_sizes(seal)
        keys = bucket_keys(ctx.secrets)
        client, upload = await asyncio.to_thread(
            lambda: begin_checkpoint_upload(storage, keys, run_id, name=name, folder=folder, sizes=sizes)
        )
    except (BucketError, StorageError, ValueError) as exc:
        ctx.report(f"checkpoint {name} did not go to the bucket ({exc})")
        return False
    sent = await _push_on_machine(machine, str(record.remote_dir), str(record.spec["python"]), upload)
    try:
        if isinstance(sent, str):
            raise BucketError(sent)  # why the machine could not send them
        await asyncio.to_thread(finish_checkpoint_upload, client, storage.location, upload, sent, seal)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the parts go and the run goes on
        await asyncio.to_thread(abort_checkpoint_upload, client, storage.location, upload)
        ctx.report(f"checkpoint {name} did not go to the bucket ({exc})")
        return False
    ctx.report(f"checkpoint {name} is safe in the bucket ({storage.url})")
    return True


async def _prune(ctx: RunContext, run_id: str) -> None:
    """Keeps the run's newest whole checkpoints in the bucket (Storage's number), deleting the older ones."""
    try:
        storage = StorageSettings.model_validate(ctx.store.get(run_id).spec[BUCKET_KEY])
        keys = bucket_keys(ctx.secrets)
        count, freed = await asyncio.to_thread(prune_bucket, storage, keys, storage.keep_checkpoints, run_id)
    except (BucketError, StorageError, ValueError) as exc:
        ctx.report(f"older checkpoints stay in the bucket ({exc})")
        return
    if count:
        ctx.report(f"deleted {count} older checkpoint(s) from the bucket ({freed / 1e6:,.1f} MB); "
                   f"the newest {storage.keep_checkpoints} stay")  # fmt: skip


async def _read_seal(machine: Machine, folder: str) -> bytes:
    """The checkpoint's seal as the machine wrote it, checked as every seal from a machine is (see ``part_files``)."""
    seal = (await machine.run(f"cat {shlex.quote(f'{folder}/{CHECKPOINT_MARKER}')}")).encode()
    try:
        files = part_files(seal, ())
    except PermanentError as exc:
        raise ValueError(str(exc)) from exc
    if not files:
        raise ValueError("the machine's checkpoint seal lists no files")
    return seal


async def _push_on_machine(
    machine: Machine, remote: str, python: str, upload: CheckpointUpload
) -> dict[str, list[str]] | str:
    """Runs the payload's push; the ETags of each file's parts, or why it failed."""
    command = f"cd {shlex.quote(remote)} && PYTHONPATH=payload {shlex.quote(python)} -m trainer_payload push"
    try:
        output = await machine.run(command, stdin=json.dumps(upload.plan), check=False, time_limit=FETCH_SECONDS)
    except RemoteError as exc:
        return str(exc)
    answer = last_json(output)
    if answer is None or "error" in answer:
        return str((answer or {}).get("error") or f"it answered {output[-300:]!r}")[:500]
    files = answer.get("files")
    if not isinstance(files, list):
        return "it answered without the parts' ETags"
    return {
        str(item.get("path")): [str(tag) for tag in item.get("etags", [])] for item in files if isinstance(item, dict)
    }


async def fetch_newest_checkpoint(
    ctx: RunContext, run_id: str, machine: Machine, remote: str, home_step: int | None
) -> None:
    """Has a new machine fetch the bucket's newest whole checkpoint when it is newer than the one at home."""
    record = ctx.store.get(run_id)
    if not record.spec.get(BUCKET_KEY):
        return
    try:
        storage = StorageSettings.model_validate(record.spec[BUCKET_KEY])
        newest, links = await asyncio.to_thread(newest_checkpoint_links, storage, bucket_keys(ctx.secrets), run_id)
    except (BucketError, StorageError, ValueError) as exc:
        ctx.report(f"the bucket's checkpoints cannot be read ({exc}); resuming from what is at home")
        return
    if newest is None or (home_step is not None and newest.step <= home_step):
        return
    problem = await fetch_on_machine(machine, remote, str(record.spec["python"]), links)
    if problem:
        ctx.report(f"the machine could not fetch {newest.name} from the bucket ({problem})")
        return
    ctx.report(f"resuming from {newest.name} in the bucket (fetched by the machine, verified)")


def delete_from_bucket(record: RunRecord, secrets: SecretStore) -> tuple[int, int]:
    """Deletes a run's checkpoints (and unfinished uploads) from the bucket it used; (checkpoints, bytes freed).

    Blocking. A run that used no bucket deletes nothing.

    Raises:
        BucketError: The store refused or could not be reached, or its keys are missing; the message names the fix.
    """
    if not record.spec.get(BUCKET_KEY):
        return 0, 0
    try:
        storage = StorageSettings.model_validate(record.spec[BUCKET_KEY])
    except (StorageError, ValueError) as exc:
        raise BucketError(f"the run's bucket settings cannot be read ({exc})") from exc
    return delete_run(storage, bucket_keys(secrets), record.id)
