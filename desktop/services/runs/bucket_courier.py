"""Checkpoints to the bucket while the app is away: links handed out ahead, the machine's courier sends them.

After the app has put one of a run's checkpoints in the bucket, it makes the uploads of the next planned checkpoints
and hands the machine their presigned links (``out/courier/mandate.json``, see
:mod:`desktop.services.buckets.mandate`), and starts the courier there (``python -m trainer_payload courier``). From
then on the machine sends each sealed checkpoint itself, whether this app is open or not. While the app follows, it
waits for the courier's receipt, checks the bucket (a machine's word is not proof), prunes, and renews the links
(a fresh week, the next planned checkpoints). When the courier could not send one, the app sends it as before.
When the run ends, the uploads nobody used are aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from typing import Any

from desktop.core.storage import StorageError, StorageSettings
from desktop.services.buckets.client import BucketError, bucket_keys
from desktop.services.buckets.mandate import Ledger, check_sent, planned_steps, renew_links, withdraw_links
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import RemoteError
from desktop.services.runs.bucket_data import BUCKET_KEY
from desktop.services.runs.context import RunContext
from trainer_payload.protocol import (
    COURIER_BUSY_NAME,
    COURIER_BUSY_SECONDS,
    COURIER_DIR_NAME,
    MANDATE_FILE_NAME,
    RECEIPTS_FILE_NAME,
)

#: The ledger of uploads made ahead, in the run's folder at home (upload ids only: no links, no keys).
LEDGER_FILE_NAME = "bucket_uploads.json"
#: Where the courier keeps its pid, relative to the run's remote folder.
PID_FILE = f"out/{COURIER_DIR_NAME}/courier.pid"
#: How long the app waits for a courier that has not started on a checkpoint before sending it itself.
START_GRACE_SECONDS = 20.0


def ledger(ctx: RunContext, run_id: str) -> Ledger | None:
    """The run's uploads made ahead, or None (none made, or a ledger that cannot be read)."""
    try:
        return Ledger.from_json((ctx.folder(run_id) / LEDGER_FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def covers(ctx: RunContext, run_id: str, name: str) -> bool:
    """Whether the links handed to the machine cover the checkpoint ``name`` (the courier sends it)."""
    made = ledger(ctx, run_id)
    return made is not None and name in made.uploads


def _storage(ctx: RunContext, run_id: str) -> StorageSettings:
    return StorageSettings.model_validate(ctx.store.get(run_id).spec[BUCKET_KEY])


async def hand_out(
    ctx: RunContext, run_id: str, machine: Machine, *, step: int, sizes: dict[str, int], total: int | None
) -> None:
    """Makes (or renews) the links of the checkpoints planned after ``step`` and hands them to the courier.

    Never raises: without links the app sends each checkpoint itself, as it does for the first one.
    """
    record = ctx.store.get(run_id)
    every = int(record.spec["training"].get("checkpoint_steps") or 0)
    made = ledger(ctx, run_id) or Ledger()
    made.sizes = dict(sizes)
    steps = planned_steps(step, every, total)
    if not steps and not made.uploads:
        return
    try:
        mandate = await asyncio.to_thread(
            renew_links, _storage(ctx, run_id), bucket_keys(ctx.secrets), run_id, made, steps
        )
        _save(ctx, run_id, made)  # before the machine has links: whatever it gets, the ledger can abort
        await _arm(machine, str(record.remote_dir), str(record.spec["python"]), mandate)
    except (BucketError, StorageError, ValueError, RemoteError) as exc:
        ctx.report(f"the machine has no links ahead for its next checkpoints ({exc}); this app sends them")
        return
    if steps:
        ctx.report(f"the machine sends its next {len(steps)} checkpoint(s) to the bucket itself, app or not")


async def rearm(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """On a (new) machine of a run with links made: renewed links and a running courier, before any checkpoint."""
    made = ledger(ctx, run_id)
    if made is None or not made.uploads or not ctx.store.get(run_id).spec.get(BUCKET_KEY):
        return
    steps = [int(name.split("-")[1]) for name in made.uploads]
    await hand_out(ctx, run_id, machine, step=min(steps) - 1, sizes=made.sizes, total=max(steps))


def _save(ctx: RunContext, run_id: str, made: Ledger) -> None:
    path = ctx.folder(run_id) / LEDGER_FILE_NAME
    partial = path.with_name(path.name + ".part")
    partial.write_text(made.to_json(), encoding="utf-8")
    partial.replace(path)


async def _arm(machine: Machine, remote: str, python: str, mandate: dict[str, Any]) -> None:
    """Writes the links on the machine (readable by its user alone) and starts the courier unless it runs."""
    folder = f"out/{COURIER_DIR_NAME}"
    await machine.run(
        f"cd {shlex.quote(remote)} && mkdir -p {folder} && umask 077 && cat > {folder}/{MANDATE_FILE_NAME}.part && "
        f"mv {folder}/{MANDATE_FILE_NAME}.part {folder}/{MANDATE_FILE_NAME}",
        stdin=json.dumps(mandate),
    )
    await machine.run(
        f"cd {shlex.quote(remote)} || exit 1; pid=$(cat {PID_FILE} 2>/dev/null); "
        'case $pid in ""|*[!0-9]*) pid= ;; esac; '
        'if [ -n "$pid" ] && grep -q courier "/proc/$pid/cmdline" 2>/dev/null; then exit 0; fi; '
        f"PYTHONPATH=payload exec {shlex.quote(python)} -m trainer_payload courier --detach {PID_FILE} "
        f">> {folder}/courier.log 2>&1"
    )


async def sent_by_courier(ctx: RunContext, run_id: str, machine: Machine, name: str, poll: float) -> bool:
    """Waits for the courier's receipt of ``name`` and checks the bucket; whether the checkpoint is whole there.

    The wait lasts while the courier works (its ``BUSY`` fresh), or :data:`START_GRACE_SECONDS` for it to start.
    """
    record = ctx.store.get(run_id)
    receipt = await _receipt(machine, str(record.remote_dir), name, poll)
    if receipt is None:
        ctx.report(f"the machine's courier did not send {name}; this app sends it")
        return False
    if receipt.get("ok") is not True:
        ctx.report(f"the machine could not send {name} itself ({str(receipt.get('error'))[:300]}); this app sends it")
        return False
    try:
        problem = await asyncio.to_thread(check_sent, _storage(ctx, run_id), bucket_keys(ctx.secrets), run_id, name)
    except (BucketError, StorageError, ValueError) as exc:
        problem = str(exc)
    if problem:
        ctx.report(f"the machine said it sent {name}, but the bucket says otherwise ({problem}); this app sends it")
        return False
    ctx.report(f"checkpoint {name} is safe in the bucket (sent by the machine)")
    return True


async def _receipt(machine: Machine, remote: str, name: str, poll: float) -> dict[str, Any] | None:
    """The courier's receipt of ``name`` once written; None when the courier neither sent it nor works on it."""
    folder = f"{shlex.quote(remote)}/out/{COURIER_DIR_NAME}"
    command = (  # the receipts' tail only: the machine is not trusted with this app's memory
        f"tail -c 65536 {folder}/{RECEIPTS_FILE_NAME} 2>/dev/null; echo; "
        f"stat -c %Y {folder}/{COURIER_BUSY_NAME} 2>/dev/null; date +%s"
    )
    started = time.monotonic()
    while True:
        lines = (await machine.run(command, check=False)).splitlines()
        for line in lines:
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict) and item.get("name") == name:
                    return item
        if not _busy(lines) and time.monotonic() - started > START_GRACE_SECONDS:
            return None
        await asyncio.sleep(poll)


def _busy(lines: list[str]) -> bool:
    """Whether the courier's ``BUSY`` (the line before the machine's clock) is fresh."""
    numbers = [int(line) for line in lines[-2:] if line.strip().isdigit()]
    return len(numbers) == 2 and numbers[1] - numbers[0] < COURIER_BUSY_SECONDS


async def withdraw(ctx: RunContext, run_id: str) -> None:
    """At the run's end: aborts the uploads made ahead that nobody used, and forgets them. Never raises."""
    made = ledger(ctx, run_id)
    if made is None or not ctx.store.get(run_id).spec.get(BUCKET_KEY):
        return
    try:
        aborted = await asyncio.to_thread(withdraw_links, _storage(ctx, run_id), bucket_keys(ctx.secrets), run_id, made)
    except (BucketError, StorageError, ValueError) as exc:
        ctx.report(
            f"the uploads made ahead for later checkpoints could not be ended ({exc}); unused, they hold no data"
        )
        return
    (ctx.folder(run_id) / LEDGER_FILE_NAME).unlink(missing_ok=True)
    if aborted:
        ctx.report(f"ended {aborted} upload(s) made ahead for checkpoints the run did not write")


def seal_sizes(seal: bytes) -> dict[str, int]:
    """Each file's size from a checked seal (see ``bucket_checkpoints._read_seal``)."""
    return {str(name): int(info["bytes"]) for name, info in json.loads(seal)["files"].items()}
