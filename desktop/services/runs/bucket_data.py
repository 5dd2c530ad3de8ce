"""A run's data through the user's bucket: sent from home once, read by every machine of the run near the GPU.

A run created while a bucket is set up (Storage in Settings) keeps that bucket in its record. Its upload puts the
prepared data files in the bucket once, under their content's digest (a file already there is not sent again, for
this run's replacement machines or any other run), and the machine downloads them itself through presigned links
(``python -m trainer_payload fetch``, the links on its stdin): no bucket key reaches the machine. When the bucket
cannot be used, or the machine cannot reach it, the data goes over SSH as before and the run says why.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path
from typing import Any

from desktop.core.settings import SettingsError
from desktop.core.storage import StorageError, StorageSettings
from desktop.services.buckets.client import BucketError, bucket_keys
from desktop.services.buckets.objects import StoredData, store_run_data
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import RemoteError
from desktop.services.platform.settings import load_settings
from desktop.services.runs.context import RunContext

#: The run record's key for the bucket it uses (the Storage settings when it was created).
BUCKET_KEY = "bucket"
#: The longest the machine may take to read the data from the bucket (a large dataset on a slow link).
FETCH_SECONDS = 3600.0


def bucket_of_settings() -> dict[str, Any]:
    """``{"bucket": …}`` for a new run's record when a bucket is set up, else ``{}``.

    A settings file that cannot be read sets up no bucket: the run then sends its data over SSH.
    """
    try:
        storage = load_settings().storage
    except SettingsError:
        return {}
    return {BUCKET_KEY: storage.model_dump()} if storage.configured else {}


async def send_data_through_bucket(
    ctx: RunContext, run_id: str, machine: Machine, remote: str, data: list[tuple[Path, str]]
) -> list[tuple[Path, str]]:
    """Puts the data in the run's bucket and has the machine fetch it; returns what is still to send over SSH.

    All of ``data`` when the run has no bucket or the bucket or the machine's download failed (the run says why);
    none when the machine holds every file, verified by its digest.
    """
    record = ctx.store.get(run_id)
    if not data or not record.spec.get(BUCKET_KEY):
        return data
    try:
        storage = StorageSettings.model_validate(record.spec[BUCKET_KEY])
        keys = bucket_keys(ctx.secrets)
        stored = await asyncio.to_thread(store_run_data, storage, keys, [(path, path.name) for path, _ in data])
    except (BucketError, StorageError, ValueError) as exc:
        ctx.report(f"the bucket cannot be used ({exc}); the data goes over SSH instead")
        return data
    ctx.report(_stored_words(storage, [item for item, _link in stored]))
    links = [
        {"url": link, "path": relative, "sha256": item.sha256, "bytes": item.bytes}
        for (item, link), (_path, relative) in zip(stored, data, strict=True)
    ]
    problem = await fetch_on_machine(machine, remote, str(record.spec["python"]), links)
    if problem:
        ctx.report(f"the machine could not read the data from the bucket ({problem}); it goes over SSH instead")
        return data
    ctx.report(f"the machine read the data from the bucket ({_size(sum(item.bytes for item, _ in stored))}, verified)")
    return []


async def fetch_on_machine(machine: Machine, remote: str, python: str, links: list[dict[str, Any]]) -> str:
    """Runs the payload's fetch on the machine, the links on its stdin.

    Returns "" when every file is there and verified, else why not.
    """
    command = f"cd {shlex.quote(remote)} && PYTHONPATH=payload {shlex.quote(python)} -m trainer_payload fetch"
    try:
        output = await machine.run(command, stdin=json.dumps(links), check=False, time_limit=FETCH_SECONDS)
    except RemoteError as exc:
        return str(exc)
    answer = last_json(output)
    if answer is None:
        return f"it answered {output[-300:]!r}"
    if "error" in answer:
        return str(answer["error"])[:500]
    fetched = {item.get("path") for item in answer.get("files", []) if isinstance(item, dict)}
    missing = [link["path"] for link in links if link["path"] not in fetched]
    return f"it did not fetch {', '.join(missing)}" if missing else ""


def last_json(output: str) -> dict[str, Any] | None:
    """The last line of the machine's output that is a JSON object (the machine is untrusted: anything else is None)."""
    for line in reversed(output.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        return value if isinstance(value, dict) else None
    return None


def _stored_words(storage: StorageSettings, stored: list[StoredData]) -> str:
    sent = [item for item in stored if item.uploaded]
    if not sent:
        return f"the data is in the bucket already ({storage.url}): nothing sent from here"
    return f"sent the data to the bucket once ({_size(sum(item.bytes for item in sent))} to {storage.url})"


def _size(count: int) -> str:
    return f"{count / 1e6:,.1f} MB" if count >= 100_000 else f"{count:,} bytes"
