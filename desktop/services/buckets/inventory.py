"""What Rentune keeps in the bucket, what it costs a month, and keeping it tidy: the newest N checkpoints per run.

Under the prefix: ``data/sha256/…`` (runs' data, stored once), ``runs/RUN/checkpoints/checkpoint-N/…`` (a checkpoint
is whole once its seal is there) and the check's leftovers. Pruning keeps each run's newest whole checkpoints and
deletes the older ones, and any unsealed folder older than the newest whole one (an upload the machine never
finished); the newest whole checkpoint is never deleted.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from desktop.core.storage import BucketLocation, StorageSettings
from desktop.services.buckets.check import failure_words
from desktop.services.buckets.client import BucketError, BucketKeys, open_bucket
from desktop.services.buckets.mandate import abort_uploads, in_progress
from trainer_payload.protocol import CHECKPOINT_MARKER

_CHECKPOINT_KEY = re.compile(r"runs/(?P<run>[^/]+)/checkpoints/checkpoint-(?P<step>\d+)/(?P<file>.+)")
_DELETE_BATCH = 1000  # S3's most keys in one DeleteObjects


@dataclass
class StoredCheckpoint:
    """One checkpoint folder in the bucket: its step, its bytes, whether its seal is there, and its keys."""

    step: int
    bytes: int = 0
    whole: bool = False
    keys: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """``checkpoint-N``."""
        return f"checkpoint-{self.step}"


@dataclass
class BucketUsage:
    """What is under the prefix: each run's checkpoints (by step), the data's bytes, and the rest's."""

    checkpoints: dict[str, dict[int, StoredCheckpoint]] = field(default_factory=lambda: defaultdict(dict))
    data_bytes: int = 0
    other_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Every byte under the prefix."""
        stored = sum(c.bytes for run in self.checkpoints.values() for c in run.values())
        return stored + self.data_bytes + self.other_bytes

    def monthly_usd(self, price_per_gb_month: float) -> float:
        """What the stored bytes cost a month at the store's price per GB (10^9 bytes) and month."""
        return self.total_bytes / 1e9 * price_per_gb_month


def read_usage(client: Any, location: BucketLocation) -> BucketUsage:
    """Lists everything under the prefix (blocking; one listing page per thousand objects)."""
    usage = BucketUsage()
    root = location.key() + "/" if location.prefix else ""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=root)
    for page in pages:
        for item in page.get("Contents", []):
            relative, size = item["Key"][len(root) :], int(item["Size"])
            found = _CHECKPOINT_KEY.fullmatch(relative)
            if found:
                step = int(found["step"])
                stored = usage.checkpoints[found["run"]].setdefault(step, StoredCheckpoint(step))
                stored.bytes += size
                stored.keys.append(item["Key"])
                stored.whole = stored.whole or found["file"] == CHECKPOINT_MARKER
            elif relative.startswith("data/"):
                usage.data_bytes += size
            else:
                usage.other_bytes += size
    return usage


def prune_plan(usage: BucketUsage, keep: int, run_id: str | None = None) -> list[tuple[str, StoredCheckpoint]]:
    """The (run, checkpoint) pairs to delete: beyond each run's newest ``keep`` whole ones, and stale unsealed ones.

    ``keep`` is at least 1: a run's newest whole checkpoint always stays.
    """
    keep = max(1, keep)
    doomed = []
    for run, steps in sorted(usage.checkpoints.items()):
        if run_id is not None and run != run_id:
            continue
        whole = sorted(step for step, stored in steps.items() if stored.whole)
        kept = set(whole[-keep:])
        newest_whole = whole[-1] if whole else None
        for step, stored in sorted(steps.items()):
            stale = not stored.whole and newest_whole is not None and step < newest_whole
            if (stored.whole and step not in kept) or stale:
                doomed.append((run, stored))
    return doomed


def delete_checkpoints(client: Any, location: BucketLocation, doomed: list[tuple[str, StoredCheckpoint]]) -> int:
    """Deletes the checkpoints' objects, each seal first (so none looks whole half deleted); the bytes freed."""
    seals = [k for _run, c in doomed for k in c.keys if k.endswith(f"/{CHECKPOINT_MARKER}")]
    rest = [k for _run, c in doomed for k in c.keys if not k.endswith(f"/{CHECKPOINT_MARKER}")]
    for keys in (seals, rest):
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + _DELETE_BATCH]]
            answer = client.delete_objects(Bucket=location.bucket, Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise BucketError(f"the store would not delete {first.get('Key')} ({first.get('Code')})")
    return sum(c.bytes for _run, c in doomed)


def prune_bucket(settings: StorageSettings, keys: BucketKeys, keep: int, run_id: str | None = None) -> tuple[int, int]:
    """Keeps each run's (or ``run_id``'s) newest ``keep`` whole checkpoints; (checkpoints deleted, bytes freed).

    Raises:
        BucketError: The store refused or could not be reached.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        doomed = prune_plan(read_usage(client, location), keep, run_id)
        return len(doomed), delete_checkpoints(client, location, doomed)
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words("prune the checkpoints", exc, settings, location, run_id or "")) from exc


def bucket_usage(settings: StorageSettings, keys: BucketKeys) -> BucketUsage:
    """What is in the bucket under the prefix (blocking).

    Raises:
        BucketError: The store refused or could not be reached.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        return read_usage(client, location)
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words("list the bucket", exc, settings, location, "")) from exc


def delete_run(settings: StorageSettings, keys: BucketKeys, run_id: str) -> tuple[int, int]:
    """Deletes every object of a run (its checkpoints) from the bucket, seals first; (checkpoints, bytes freed).

    Its unfinished uploads (the links made ahead, a checkpoint cut short) are aborted too.

    The run's data stays: it is stored by content, and other runs may read the same file.

    Raises:
        BucketError: The store refused or could not be reached.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        doomed = [(run_id, c) for c in read_usage(client, location).checkpoints.get(run_id, {}).values()]
        freed = delete_checkpoints(client, location, doomed)
        abort_uploads(client, location, run_id, sorted(in_progress(client, location, run_id)))
        return len(doomed), freed
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words("delete the run's objects", exc, settings, location, run_id)) from exc
