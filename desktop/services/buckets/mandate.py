"""Links ahead for the machine's courier: multipart uploads of a run's next planned checkpoints, presigned.

Once the app has seen one of a run's checkpoints it knows the files every later one has (their names; their sizes
change little). It starts a multipart upload per file of each of the next planned checkpoints and hands the machine
the presigned part URLs, each upload's presigned completion and the seal's presigned ``PUT``: the courier on the
machine (``python -m trainer_payload courier``) then sends checkpoints by itself while this app is away, with no
bucket key on the machine. Each link writes one object of the run's prefix, for :data:`LINK_SECONDS`.

The :class:`Ledger`, kept in the run's folder at home, holds the upload ids (never links, never keys): links are made
again from it when the app renews them, and the uploads nobody used are aborted when the run ends.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from desktop.core.storage import BucketLocation, StorageSettings
from desktop.services.buckets.check import failure_words
from desktop.services.buckets.checkpoints import PART_BYTES, checkpoint_prefix
from desktop.services.buckets.client import BucketError, BucketKeys, open_bucket
from trainer_payload.protocol import CHECKPOINT_MARKER

#: How many planned checkpoints the links cover ahead of the newest one seen (renewed as the app follows the run).
CHECKPOINTS_AHEAD = 24
#: How long the links work: the longest a SigV4 presigned URL may (7 days).
LINK_SECONDS = 7 * 24 * 3600


@dataclass
class Ledger:
    """The run's uploads made ahead: the files a checkpoint has (name → bytes) and each checkpoint's upload ids.

    Attributes:
        sizes: The files of the checkpoint the links were made from, with their sizes.
        uploads: For each planned checkpoint (``checkpoint-N``), each file's multipart upload id.
    """

    sizes: dict[str, int] = field(default_factory=dict)
    uploads: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> str:
        """The ledger as JSON (for the run's folder)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        """Reads :meth:`to_json`'s output.

        Raises:
            ValueError: It is not a ledger.
        """
        data = json.loads(text)
        sizes = {str(name): int(size) for name, size in data["sizes"].items()}
        uploads = {str(c): {str(f): str(u) for f, u in files.items()} for c, files in data["uploads"].items()}
        return cls(sizes, uploads)


def planned_steps(after: int, every: int, total: int | None, ahead: int = CHECKPOINTS_AHEAD) -> list[int]:
    """The steps of the next ``ahead`` checkpoints after step ``after``: multiples of ``every``, and the last step.

    ``total`` (the run's steps in all, when known) ends the list; the trainer saves at the last step too.
    """
    if every <= 0:
        return []
    steps: list[int] = []
    step = (after // every + 1) * every
    while len(steps) < ahead and (total is None or step <= total):
        steps.append(step)
        step += every
    if total is not None and total > after and total not in steps and len(steps) < ahead:
        steps.append(total)
    return steps


def _parts(size: int) -> int:
    """How many part links a file gets: enough at 64 MiB a part, and one more for growth (larger parts beyond)."""
    return -(-size // PART_BYTES) + 1


def issue_links(
    client: Any, location: BucketLocation, run_id: str, ledger: Ledger, steps: list[int]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Makes the uploads of the planned checkpoints not yet in the ledger and presigns every link (blocking).

    The ledger is updated in place: planned checkpoints kept (or started); those no longer planned, made for other
    files, or whose uploads are no longer in progress (completed, or aborted meanwhile) dropped.

    Returns:
        The courier's ``mandate.json``, and the (key, upload id) of each upload dropped (to abort).
    """
    wanted = {f"checkpoint-{step}" for step in steps}
    dropped = _drop_stale(client, location, run_id, ledger, wanted)
    for name in sorted(wanted - set(ledger.uploads)):
        prefix = checkpoint_prefix(location, run_id, name)
        ledger.uploads[name] = {
            file: str(client.create_multipart_upload(Bucket=location.bucket, Key=f"{prefix}/{file}")["UploadId"])
            for file in sorted(ledger.sizes)
        }
    mandate = {
        "expires": time.time() + LINK_SECONDS,
        "checkpoints": {name: _links(client, location, run_id, name, ledger) for name in sorted(ledger.uploads)},
    }
    return mandate, dropped


def _drop_stale(
    client: Any, location: BucketLocation, run_id: str, ledger: Ledger, wanted: set[str]
) -> list[tuple[str, str]]:
    """Takes out of the ledger what cannot serve the ``wanted`` checkpoints; the (key, upload id) taken out."""
    alive = in_progress(client, location, run_id)
    dropped: list[tuple[str, str]] = []
    for name in list(ledger.uploads):
        prefix = checkpoint_prefix(location, run_id, name)
        uploads = {(f"{prefix}/{file}", upload) for file, upload in ledger.uploads[name].items()}
        if name not in wanted or set(ledger.uploads[name]) != set(ledger.sizes) or not uploads <= alive:
            dropped += sorted(uploads)
            del ledger.uploads[name]
    return dropped


def _links(client: Any, location: BucketLocation, run_id: str, name: str, ledger: Ledger) -> dict[str, Any]:
    prefix = checkpoint_prefix(location, run_id, name)

    def sign(method: str, key: str, **params: Any) -> str:
        url: str = client.generate_presigned_url(
            method, Params={"Bucket": location.bucket, "Key": key, **params}, ExpiresIn=LINK_SECONDS
        )
        return url

    files = {}
    for file, upload in ledger.uploads[name].items():
        key = f"{prefix}/{file}"
        parts = [
            sign("upload_part", key, UploadId=upload, PartNumber=n) for n in range(1, _parts(ledger.sizes[file]) + 1)
        ]
        files[file] = {"parts": parts, "complete": sign("complete_multipart_upload", key, UploadId=upload)}
    return {"files": files, "seal": sign("put_object", f"{prefix}/{CHECKPOINT_MARKER}")}


def in_progress(client: Any, location: BucketLocation, run_id: str) -> set[tuple[str, str]]:
    """The (key, upload id) of every multipart upload in progress under the run's folder (blocking)."""
    found: set[tuple[str, str]] = set()
    pages = client.get_paginator("list_multipart_uploads").paginate(
        Bucket=location.bucket, Prefix=location.key("runs", run_id) + "/"
    )
    for page in pages:
        found |= {(item["Key"], item["UploadId"]) for item in page.get("Uploads", [])}
    return found


def abort_uploads(client: Any, location: BucketLocation, run_id: str, uploads: list[tuple[str, str]]) -> int:
    """Aborts those of ``uploads`` still in progress (one listed; a completed one is never touched); how many.

    Best effort: an upload that cannot be aborted stays, and ``rentune storage ls`` shows it.
    """
    aborted = 0
    for key, upload in sorted(set(uploads) & in_progress(client, location, run_id)):
        try:
            client.abort_multipart_upload(Bucket=location.bucket, Key=key, UploadId=upload)
            aborted += 1
        except Exception:  # noqa: BLE001, S112 - best effort: it stays listed, and costs only what was sent
            continue
    return aborted


def ledger_uploads(location: BucketLocation, run_id: str, ledger: Ledger) -> list[tuple[str, str]]:
    """Every (key, upload id) the ledger holds."""
    return [
        (f"{checkpoint_prefix(location, run_id, name)}/{file}", upload)
        for name, files in ledger.uploads.items()
        for file, upload in files.items()
    ]


def sent_problem(client: Any, location: BucketLocation, run_id: str, name: str) -> str | None:
    """Why the checkpoint ``name`` is not whole in the bucket (its seal, and each file it lists at its size), or None.

    What a machine says it sent is checked here, not believed: the machine is not trusted.
    """
    prefix = checkpoint_prefix(location, run_id, name)
    try:
        seal = json.loads(client.get_object(Bucket=location.bucket, Key=f"{prefix}/{CHECKPOINT_MARKER}")["Body"].read())
        wanted = {str(file): int(info["bytes"]) for file, info in seal["files"].items()}
    except client.exceptions.NoSuchKey:
        return "its seal is not in the bucket"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"its seal in the bucket is not the payload's ({exc})"
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=f"{prefix}/"):
        found |= {item["Key"][len(prefix) + 1 :]: int(item["Size"]) for item in page.get("Contents", [])}
    wrong = [file for file, size in wanted.items() if found.get(file) != size]
    return f"{', '.join(sorted(wrong)[:3])} missing or of the wrong size" if wrong else None


def renew_links(
    settings: StorageSettings, keys: BucketKeys, run_id: str, ledger: Ledger, steps: list[int]
) -> dict[str, Any]:
    """:func:`issue_links` through the bucket's client, the dropped uploads aborted (blocking).

    Raises:
        BucketError: The store refused or could not be reached; the message names the fix.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        mandate, dropped = issue_links(client, location, run_id, ledger, steps)
        if dropped:
            abort_uploads(client, location, run_id, dropped)
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words("make the links ahead", exc, settings, location, run_id)) from exc
    return mandate


def withdraw_links(settings: StorageSettings, keys: BucketKeys, run_id: str, ledger: Ledger) -> int:
    """Aborts every upload of the ledger nobody completed; how many (blocking).

    Raises:
        BucketError: The store refused or could not be reached.
    """
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        return abort_uploads(client, location, run_id, ledger_uploads(location, run_id, ledger))
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words("abort the unused uploads", exc, settings, location, run_id)) from exc


def check_sent(settings: StorageSettings, keys: BucketKeys, run_id: str, name: str) -> str | None:
    """:func:`sent_problem` through the bucket's client (blocking); a store that cannot be read is a problem too."""
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3: only when a bucket is used

    client, location = open_bucket(settings, keys)
    try:
        return sent_problem(client, location, run_id, name)
    except (BotoCoreError, ClientError) as exc:
        return failure_words("read the checkpoint back", exc, settings, location, name)
