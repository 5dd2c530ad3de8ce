"""Proves the bucket works before a run relies on it: write, read back, delete, and see it gone.

Like the keyring probe: the bucket is looked up, then a small object of random bytes under ``PREFIX/.rentune-check/``
is written, read back and compared byte for byte, deleted, and seen gone. Each failure names the step and the fix
(keys, bucket name, region, endpoint, permissions), never a traceback.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from desktop.core.storage import BucketLocation, StorageSettings
from desktop.services.buckets.client import BucketError, BucketKeys, open_bucket

#: The probe object's size: enough to be a real upload, small enough for any link.
PROBE_BYTES = 64 * 1024
CHECK_FOLDER = ".rentune-check"


@dataclass(frozen=True)
class BucketCheck:
    """A bucket that passed: where, and how long each step took.

    Attributes:
        location: The bucket and prefix checked.
        endpoint: The store's endpoint ("" for AWS).
        seconds: Seconds taken to write, read back and delete the probe object.
    """

    location: BucketLocation
    endpoint: str
    seconds: dict[str, float]

    def words(self) -> str:
        """One line for the user: what passed, and how fast."""
        took = ", ".join(f"{step} {ms * 1000:.0f} ms" for step, ms in self.seconds.items())
        where = self.endpoint or "AWS"
        return f"wrote, read back and deleted a test object in {self.location.url} at {where} ({took})"


def check_bucket(settings: StorageSettings, keys: BucketKeys, *, client: Any = None) -> BucketCheck:
    """Writes, reads back and deletes a probe object in the bucket (blocking: run it off the event loop).

    Args:
        settings: The bucket as set up.
        keys: Its keys.
        client: An S3 client to use instead of one made from ``settings`` and ``keys`` (tests).

    Raises:
        BucketError: A step failed; the message names it and the fix. A probe object left behind by a failed delete
            is named too.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    location = settings.location
    client = client or open_bucket(settings, keys)[0]
    key = location.key(CHECK_FOLDER, f"{secrets.token_hex(8)}.bin")
    body = secrets.token_bytes(PROBE_BYTES)
    seconds: dict[str, float] = {}
    step = "find the bucket"
    try:
        # First, as some stores (SeaweedFS, MinIO with its defaults) make a missing bucket on the first write. A
        # listing, not HEAD: its answer has a body, so a wrong key is told apart from a missing permission.
        client.list_objects_v2(Bucket=location.bucket, Prefix=location.key(CHECK_FOLDER) + "/", MaxKeys=1)
        step = "write"
        seconds["write"] = _timed(lambda: client.put_object(Bucket=location.bucket, Key=key, Body=body))
        step = "read"
        seconds["read"] = _timed(lambda: _read_back(client, location.bucket, key, body))
        step = "delete"
        seconds["delete"] = _timed(lambda: client.delete_object(Bucket=location.bucket, Key=key))
        step = "see it gone"
        _gone(client, location.bucket, key)
    except (BotoCoreError, ClientError) as exc:
        raise BucketError(failure_words(step, exc, settings, location, key)) from exc
    return BucketCheck(location, settings.endpoint, seconds)


def _timed(action: Any) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def _read_back(client: Any, bucket: str, key: str, body: bytes) -> None:
    got = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    if got != body:
        raise BucketError(
            f"the bucket gave back {len(got):,} bytes that differ from the {len(body):,} written to {key}: "
            "the store or a proxy in between changes objects; use another endpoint"
        )


def _gone(client: Any, bucket: str, key: str) -> None:
    from botocore.exceptions import ClientError

    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if _status(exc) == 404:
            return
        raise
    raise BucketError(f"the test object {key} is still there after it was deleted: check the bucket's delete policy")


#: The store's error codes, each with what it means and the fix ({where}, {bucket}, {url}, {region}, {step}, {left}).
_CODE_WORDS = {
    **dict.fromkeys(
        ("InvalidAccessKeyId", "InvalidAccessKeyID"),
        "{where} does not know the bucket's access key ID: copy it again (Settings, API keys){left}",
    ),
    **dict.fromkeys(
        ("SignatureDoesNotMatch", "InvalidSignature"),
        "the bucket's secret key does not match its access key ID: copy the secret key again{left}",
    ),
    **dict.fromkeys(
        ("NoSuchBucket", "404"),
        "bucket {bucket} does not exist at {where}: create it in the store's console, or fix the address",
    ),
    **dict.fromkeys(
        ("AuthorizationHeaderMalformed", "PermanentRedirect", "IllegalLocationConstraintException"),
        "bucket {bucket} is not in region {region}: set the bucket's own region in Storage",
    ),
    **dict.fromkeys(
        ("AccessDenied", "Forbidden", "403"),
        "the keys may not {step} in {url}: give them read, write and delete on the bucket (or on its prefix){left}",
    ),
}


def failure_words(step: str, exc: Exception, settings: StorageSettings, location: BucketLocation, key: str) -> str:
    """What went wrong at ``step`` and the fix, from the store's error code (no traceback, no key values)."""
    where = settings.endpoint or "AWS"
    code = _code(exc)
    if code is None:
        return f"cannot reach {where} ({type(exc).__name__}): check the endpoint and this computer's network"
    left = f" (the test object {key} may be left behind: delete it)" if step in {"delete", "see it gone"} else ""
    words = _CODE_WORDS.get(code, "the store refused to {step} in {url} ({code}: {message}){left}")
    return words.format(
        where=where, bucket=location.bucket, url=location.url, region=settings.region, step=step, left=left,
        code=code, message=_message(exc),
    )  # fmt: skip


def _code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    return str(response.get("Error", {}).get("Code") or _status(exc) or "") or None


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None
    return int(status) if isinstance(status, int) else None


def _message(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    message = response.get("Error", {}).get("Message", "") if isinstance(response, dict) else ""
    return str(message)[:200] or type(exc).__name__
