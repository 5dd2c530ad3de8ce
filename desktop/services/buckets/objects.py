"""Objects in the user's bucket: a run's data, stored once under its content's digest, and presigned links to it.

A data file's key is ``PREFIX/data/sha256/DIGEST/NAME``: the same bytes are stored once, whichever run or machine
asks, and an object there is whole (S3 shows a multipart upload only once it is complete). A machine reads it through
a presigned GET URL, which reads that one object for a few hours and holds no key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.storage import BucketLocation, StorageSettings
from desktop.services.buckets.check import failure_words
from desktop.services.buckets.client import BucketError, BucketKeys, open_bucket

#: How long a presigned link to a run's data lasts: enough for a slow machine's bootstrap, not a standing credential.
LINK_SECONDS = 4 * 3600
#: The metadata key each data object carries its SHA-256 under.
DIGEST_METADATA = "sha256"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StoredData:
    """A data file in the bucket.

    Attributes:
        key: Its object key.
        sha256: Its content's digest.
        bytes: Its size.
        uploaded: Whether this call sent it (False: it was there already).
    """

    key: str
    sha256: str
    bytes: int
    uploaded: bool


def file_digest(path: Path) -> str:
    """The SHA-256 of a file, read in chunks (blocking)."""
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def data_key(location: BucketLocation, digest: str, name: str) -> str:
    """The content-addressed key of a data file: ``PREFIX/data/sha256/DIGEST/NAME``."""
    return location.key("data", "sha256", digest, name)


def store_run_data(
    settings: StorageSettings, keys: BucketKeys, files: list[tuple[Path, str]], *, client: Any = None
) -> list[tuple[StoredData, str]]:
    """Puts each (local file, name) in the bucket once, and a presigned link to read it (blocking).

    Raises:
        BucketError: The store refused or could not be reached; the message names the fix.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    location = settings.location
    client = client or open_bucket(settings, keys)[0]
    stored = []
    for path, name in files:
        try:
            data = store_data_once(client, location, path, name)
            stored.append((data, presigned_get(client, location, data.key)))
        except (BotoCoreError, ClientError) as exc:
            raise BucketError(failure_words("write the run's data", exc, settings, location, name)) from exc
    return stored


def store_data_once(client: Any, location: BucketLocation, path: Path, name: str) -> StoredData:
    """Puts a data file in the bucket unless the same bytes are there already (blocking).

    Raises:
        botocore.exceptions.ClientError, BotoCoreError: The store refused or could not be reached.
    """
    from botocore.exceptions import ClientError

    digest, size = file_digest(path), path.stat().st_size
    key = data_key(location, digest, name)
    try:
        head = client.head_object(Bucket=location.bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
            raise
    else:
        if head.get("ContentLength") == size:
            return StoredData(key, digest, size, uploaded=False)
    client.upload_file(str(path), location.bucket, key, ExtraArgs={"Metadata": {DIGEST_METADATA: digest}})
    return StoredData(key, digest, size, uploaded=True)


def presigned_get(client: Any, location: BucketLocation, key: str, seconds: int = LINK_SECONDS) -> str:
    """A URL that reads one object for ``seconds``, with no key (signed here, never sent anywhere but the machine)."""
    url: str = client.generate_presigned_url(
        "get_object", Params={"Bucket": location.bucket, "Key": key}, ExpiresIn=seconds
    )
    return url
