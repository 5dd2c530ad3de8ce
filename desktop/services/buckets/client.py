"""A boto3 S3 client for the user's bucket, from the Storage settings and the keyring.

boto3, not a hand-written signer: it is the reference S3 client every S3-compatible store is tested against, and it
presigns the multipart part URLs the rented machine will upload checkpoints with (no bucket key on the machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from desktop.core.storage import BucketLocation, StorageSettings
from desktop.services.platform.secrets import SecretName, SecretStore, SecretStoreError

#: Seconds to wait for the store to answer before saying it cannot be reached.
CONNECT_SECONDS = 10.0
READ_SECONDS = 60.0


class BucketError(Exception):
    """The bucket cannot be used; the message names the problem and the fix."""


@dataclass(frozen=True)
class BucketKeys:
    """The bucket's access key ID and secret key (from the keyring or the environment)."""

    key_id: str
    secret: str


def bucket_keys(secrets: SecretStore | None = None) -> BucketKeys:
    """The bucket's keys.

    Raises:
        BucketError: One is missing or cannot be read; the message says where to set it.
    """
    store = secrets or SecretStore()
    values = []
    for name in (SecretName.BUCKET_KEY_ID, SecretName.BUCKET_SECRET):
        try:
            value = store.get(name)
        except SecretStoreError as exc:
            raise BucketError(str(exc)) from exc
        if not value:
            raise BucketError(
                f"no {name.label} is set: save it under API keys in Settings, run `rentune keys set {name.value}`, "
                f"or set {name.env_var}"
            )
        values.append(value)
    return BucketKeys(*values)


def open_bucket(settings: StorageSettings, keys: BucketKeys) -> tuple[Any, BucketLocation]:
    """A boto3 S3 client for the bucket, and where Rentune's objects go in it (blocking: builds a botocore session).

    Path-style addressing: MinIO, SeaweedFS and self-hosted stores serve buckets under the endpoint's path, and AWS,
    R2, B2 and Wasabi take it too. Signature version 4, as every S3-compatible store accepts.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        connect_timeout=CONNECT_SECONDS,
        read_timeout=READ_SECONDS,
        retries={"max_attempts": 3, "mode": "standard"},
    )
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=settings.endpoint or None,
        region_name=settings.region,
        aws_access_key_id=keys.key_id,
        aws_secret_access_key=keys.secret,
        config=config,
    )
    return client, settings.location
