"""A run's checkpoints in the user's bucket: multipart uploads the machine fills through presigned part URLs.

``PREFIX/runs/RUN/checkpoints/checkpoint-N/`` holds a checkpoint's files and, last, its seal
(``rentune_checkpoint.json``, the payload's list of every file with its size and SHA-256). The app starts one
multipart upload per file and presigns its parts; the machine sends them (``python -m trainer_payload push``) and
hands back the parts' ETags; the app completes every file, the seal last. S3 shows an object only once its upload is
complete, so a checkpoint whose seal is in the bucket is whole, and a machine killed mid-upload leaves nothing that
looks whole (its unfinished uploads are aborted, and cost nothing more).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from desktop.core.storage import BucketLocation, StorageSettings
from desktop.services.buckets.check import failure_words
from desktop.services.buckets.client import BucketError, BucketKeys, open_bucket
from desktop.services.buckets.objects import presigned_get
from trainer_payload.protocol import CHECKPOINT_MARKER

#: Each part's size: S3 takes 5 MiB to 5 GiB a part and at most 10,000 parts (so files up to 625 GB here).
PART_BYTES = 64 << 20
#: How long the presigned part URLs of one checkpoint's upload last.
PUSH_LINK_SECONDS = 3 * 3600


@dataclass
class CheckpointUpload:
    """One checkpoint's upload in progress: its files' multipart uploads and the machine's plan.

    Attributes:
        prefix: The checkpoint's folder in the bucket (``…/checkpoints/checkpoint-N``).
        uploads: Each file's (relative name, upload id, size).
        plan: What the machine's push reads: each file's path in the run folder, size and presigned parts.
    """

    prefix: str
    uploads: list[tuple[str, str, int]] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)


def checkpoint_prefix(location: BucketLocation, run_id: str, name: str) -> str:
    """Where a run's checkpoint goes: ``PREFIX/runs/RUN/checkpoints/NAME``."""
    return location.key("runs", run_id, "checkpoints", name)


def start_checkpoint_upload(
    client: Any, location: BucketLocation, prefix: str, remote_folder: str, sizes: dict[str, int]
) -> CheckpointUpload:
    """Starts a multipart upload per file the seal lists and presigns every part for the machine (blocking).

    ``remote_folder`` is the checkpoint's folder relative to the run's remote folder (``out/checkpoints/…``). The
    seal itself is not in it: the app writes it once every file is complete.
    """
    upload = CheckpointUpload(prefix)
    files = []
    for name in sorted(sizes):
        key = f"{prefix}/{name}"
        upload_id = str(client.create_multipart_upload(Bucket=location.bucket, Key=key)["UploadId"])
        upload.uploads.append((name, upload_id, sizes[name]))
        parts = [
            {"number": number, "offset": offset, "size": min(PART_BYTES, sizes[name] - offset), "url": _part_url(
                client, location.bucket, key, upload_id, number)}
            for number, offset in enumerate(range(0, max(sizes[name], 1), PART_BYTES), start=1)
        ]  # fmt: skip
        files.append({"path": f"{remote_folder}/{name}", "bytes": sizes[name], "parts": parts})
    upload.plan = {"files": files}
    return upload


def _part_url(client: Any, bucket: str, key: str, upload_id: str, number: int) -> str:
    params = {"Bucket": bucket, "Key": key, "UploadId": upload_id, "PartNumber": number}
    url: str = client.generate_presigned_url("upload_part", Params=params, ExpiresIn=PUSH_LINK_SECONDS)
    return url


def finish_checkpoint_upload(
    client: Any, location: BucketLocation, upload: CheckpointUpload, etags: dict[str, list[str]], seal: bytes
) -> None:
    """Completes every file's upload with the machine's part ETags, then writes the seal: the checkpoint is whole.

    Raises:
        BucketError: The machine's answer misses a file or a part (nothing is sealed).
    """
    for (name, upload_id, _size), planned in zip(upload.uploads, upload.plan["files"], strict=True):
        tags = etags.get(planned["path"])
        if tags is None or len(tags) != len(planned["parts"]):
            raise BucketError(f"the machine did not send every part of {name}")
        parts = [{"PartNumber": number, "ETag": tag} for number, tag in enumerate(tags, start=1)]
        client.complete_multipart_upload(
            Bucket=location.bucket, Key=f"{upload.prefix}/{name}", UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    client.put_object(Bucket=location.bucket, Key=f"{upload.prefix}/{CHECKPOINT_MARKER}", Body=seal)


def abort_checkpoint_upload(client: Any, location: BucketLocation, upload: CheckpointUpload) -> None:
    """Aborts every file's unfinished upload, so its parts stop costing storage (blocking; failures are ignored)."""
    for name, upload_id, _size in upload.uploads:
        try:
            client.abort_multipart_upload(Bucket=location.bucket, Key=f"{upload.prefix}/{name}", UploadId=upload_id)
        except Exception:  # noqa: BLE001, S112 - best effort: an upload already completed or gone stays so
            continue


@dataclass(frozen=True)
class BucketCheckpoint:
    """A whole checkpoint in the bucket: its name and step, its seal, and the files the seal lists (size, digest)."""

    name: str
    step: int
    files: dict[str, tuple[int, str]]
    seal: bytes


def newest_bucket_checkpoint(client: Any, location: BucketLocation, run_id: str) -> BucketCheckpoint | None:
    """The newest checkpoint of the run whose seal is in the bucket (None without one; blocking)."""
    root = location.key("runs", run_id, "checkpoints") + "/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=root)
    sealed = sorted(
        (int(parts[0].split("-")[1]), parts[0])
        for page in pages
        for item in page.get("Contents", [])
        if len(parts := item["Key"][len(root) :].split("/")) == 2  # checkpoint-N/seal
        and parts[1] == CHECKPOINT_MARKER
        and parts[0].startswith("checkpoint-")
        and parts[0].split("-")[1].isdigit()
    )
    if not sealed:
        return None
    step, name = sealed[-1]
    seal = client.get_object(Bucket=location.bucket, Key=f"{root}{name}/{CHECKPOINT_MARKER}")["Body"].read()
    files = {n: (int(info["bytes"]), str(info["sha256"])) for n, info in json.loads(seal)["files"].items()}
    return BucketCheckpoint(name, step, files, seal)


def checkpoint_links(
    client: Any, location: BucketLocation, run_id: str, checkpoint: BucketCheckpoint
) -> list[dict[str, Any]]:
    """What the machine's fetch reads to get a bucket checkpoint: every file, then the seal (blocking).

    The seal last: a fetch cut short leaves a folder without it, which the trainer never resumes from.
    """
    prefix = checkpoint_prefix(location, run_id, checkpoint.name)
    seal = (len(checkpoint.seal), hashlib.sha256(checkpoint.seal).hexdigest())
    listed = [*checkpoint.files.items(), (CHECKPOINT_MARKER, seal)]
    folder = f"out/checkpoints/{checkpoint.name}"
    return [
        {"url": presigned_get(client, location, f"{prefix}/{name}"), "path": f"{folder}/{name}", "sha256": digest,
         "bytes": size}
        for name, (size, digest) in listed
    ]  # fmt: skip


def begin_checkpoint_upload(
    settings: StorageSettings, keys: BucketKeys, run_id: str, *, name: str, folder: str, sizes: dict[str, int]
) -> tuple[Any, CheckpointUpload]:
    """The client and a started upload of a run's checkpoint ``name`` from ``folder`` on the machine (blocking).

    Raises:
        BucketError: The store refused or could not be reached; the message names the fix.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        return client, start_checkpoint_upload(
            client, location, checkpoint_prefix(location, run_id, name), folder, sizes
        )
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words("start the checkpoint's upload", exc, settings, location, name)) from exc


def newest_checkpoint_links(
    settings: StorageSettings, keys: BucketKeys, run_id: str
) -> tuple[BucketCheckpoint | None, list[dict[str, Any]]]:
    """The run's newest whole checkpoint in the bucket and the links a machine fetches it by (blocking).

    Raises:
        BucketError: The store refused or could not be reached, or a seal there is not the payload's.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        newest = newest_bucket_checkpoint(client, location, run_id)
        return newest, checkpoint_links(client, location, run_id, newest) if newest else []
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words("read the checkpoints", exc, settings, location, run_id)) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise BucketError(f"a checkpoint seal in the bucket is damaged ({exc}); delete that checkpoint") from exc
