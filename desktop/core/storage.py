"""The user's bucket: an S3-compatible object store near the GPUs, named by ``s3://bucket/prefix``.

Pure: parsing and checking what the user typed. The keys live in the keyring, never here; talking to the bucket is
:mod:`desktop.services.buckets`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: S3's bucket names: 3 to 63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: A prefix's parts: no empty part, no "." or "..", nothing but printable characters.
_PREFIX_PART = re.compile(r"[A-Za-z0-9!_.*'()-]+")


class StorageError(ValueError):
    """What the user typed for the bucket cannot work; the message names the field and the fix."""


@dataclass(frozen=True)
class BucketLocation:
    """Where Rentune keeps its objects: a bucket and a prefix inside it ("" for the bucket's top)."""

    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        """``s3://bucket/prefix`` (``s3://bucket`` without a prefix)."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` under the prefix (joined with ``/``)."""
        return "/".join(part for part in (self.prefix, *parts) if part)


def parse_bucket_url(url: str) -> BucketLocation:
    """``s3://bucket/prefix`` as a location.

    Raises:
        StorageError: Not an ``s3://`` address, a bucket name S3 refuses, or a prefix with an empty, ``.`` or ``..``
            part or characters outside S3's safe set.
    """
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme != "s3" or not parts.netloc:
        raise StorageError(f"bucket {text!r} is not an s3:// address: write it like s3://my-bucket/rentune")
    if parts.query or parts.fragment or parts.port is not None or "@" in parts.netloc:
        raise StorageError(
            f"bucket {text!r} holds more than a bucket and a prefix: write it like s3://my-bucket/rentune"
        )
    bucket = parts.netloc
    if not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise StorageError(
            f"bucket name {bucket!r} is not one S3 takes: 3 to 63 lower-case letters, digits, dots and hyphens"
        )
    prefix_parts = parts.path.split("/")
    inner = prefix_parts[1:-1] if parts.path.endswith("/") else prefix_parts[1:]
    if any(not _PREFIX_PART.fullmatch(part) or part in {".", ".."} for part in inner):
        raise StorageError(
            f"prefix {parts.path!r} of the bucket address must be folder names of letters, digits and -_.!*'() "
            "separated by single slashes, like s3://my-bucket/team/rentune"
        )
    return BucketLocation(bucket, "/".join(inner))


def check_endpoint(endpoint: str) -> str:
    """The endpoint as given, or "" for AWS itself.

    Raises:
        StorageError: Not an http(s) address with a host.
    """
    text = endpoint.strip().rstrip("/")
    if not text:
        return ""
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.query or parts.fragment:
        raise StorageError(
            f"endpoint {text!r} is not an http(s) address: write it like https://s3.eu-central-003.backblazeb2.com, "
            "or leave it empty for AWS"
        )
    return text


class StorageSettings(BaseModel):
    """The bucket Rentune uses, as set up once in Settings (its keys are in the keyring).

    Attributes:
        url: ``s3://bucket/prefix``; "" while no bucket is set up.
        endpoint: The store's S3 endpoint (R2, B2, Wasabi, MinIO, ...); "" for AWS.
        region: The bucket's region (``auto`` for R2; AWS and most others name one, like ``eu-central-1``).
        keep_checkpoints: How many whole checkpoints of each run stay in the bucket (older ones are deleted).
        price_per_gb_month: What the store charges a month per GB stored (S3 Standard's $0.023 unless set), for the
            monthly cost shown.
        full_checkpoints_home: Whether a full fine-tune's checkpoints also come home (they are the whole model:
            by default they stay in the bucket; LoRA and QLoRA checkpoints always come home).
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    url: str = ""
    endpoint: str = ""
    region: str = Field(default="us-east-1", pattern="^[a-z0-9-]{1,40}$")
    keep_checkpoints: int = Field(default=3, ge=1, le=1000)
    price_per_gb_month: float = Field(default=0.023, ge=0, le=10)
    full_checkpoints_home: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return parse_bucket_url(value).url if value.strip() else ""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return check_endpoint(value)

    @property
    def configured(self) -> bool:
        """Whether a bucket is set up."""
        return bool(self.url)

    @property
    def location(self) -> BucketLocation:
        """The bucket and prefix.

        Raises:
            StorageError: No bucket is set up.
        """
        if not self.url:
            raise StorageError("no bucket is set up: add one under Storage in Settings")
        return parse_bucket_url(self.url)
