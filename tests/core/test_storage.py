"""The bucket's address, endpoint and region as typed: kept when S3 takes them, refused with the fix otherwise."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from desktop.core.settings import SettingsError, settings_from_dict
from desktop.core.storage import BucketLocation, StorageError, StorageSettings, check_endpoint, parse_bucket_url


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("  s3://my.bucket-2/team/rentune/ ", "my.bucket-2", "team/rentune"),
        ("s3://abc/a_b/c(1)", "abc", "a_b/c(1)"),
    ],
)
def test_an_s3_address_gives_its_bucket_and_prefix(url: str, bucket: str, prefix: str) -> None:
    location = parse_bucket_url(url)
    assert location == BucketLocation(bucket, prefix)
    assert location.key("runs", "r1", "data.jsonl") == "/".join(p for p in (prefix, "runs/r1/data.jsonl") if p)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://my-bucket/x", "is not an s3:// address"),
        ("my-bucket/x", "is not an s3:// address"),
        ("s3://My_Bucket/x", "bucket name 'My_Bucket' is not one S3 takes"),
        ("s3://ab", "bucket name 'ab' is not one S3 takes"),
        ("s3://a..b/x", "bucket name 'a..b' is not one S3 takes"),
        ("s3://bucket/a//b", "must be folder names"),
        ("s3://bucket/a/../b", "must be folder names"),
        ("s3://bucket/a b", "must be folder names"),
        ("s3://user@bucket/x", "holds more than a bucket and a prefix"),
        ("s3://bucket:9000/x", "holds more than a bucket and a prefix"),
        ("s3://bucket/x?versionId=1", "holds more than a bucket and a prefix"),
    ],
)
def test_an_address_s3_would_refuse_is_refused_with_the_fix(url: str, words: str) -> None:
    with pytest.raises(StorageError, match=re.escape(words)):
        parse_bucket_url(url)


def test_the_endpoint_is_an_http_address_or_empty_for_aws() -> None:
    assert check_endpoint("") == "" and check_endpoint(" https://s3.eu-central-003.backblazeb2.com/ ") == (
        "https://s3.eu-central-003.backblazeb2.com"
    )
    assert check_endpoint("http://127.0.0.1:9000") == "http://127.0.0.1:9000"
    for bad in ("s3.amazonaws.com", "ftp://host", "https://", "https://h/?x=1"):
        with pytest.raises(StorageError, match="is not an http\\(s\\) address"):
            check_endpoint(bad)


def test_storage_settings_keep_a_valid_bucket_and_refuse_a_bad_one_in_the_settings_file() -> None:
    storage = settings_from_dict({"storage": {"url": "s3://b-1/p/", "endpoint": "http://h:1/", "region": "auto"}})
    assert storage.storage == StorageSettings(url="s3://b-1/p", endpoint="http://h:1", region="auto")
    assert storage.storage.configured and storage.storage.location == BucketLocation("b-1", "p")
    assert not settings_from_dict({}).storage.configured, "no bucket until one is set up"
    with pytest.raises(StorageError, match="no bucket is set up"):
        _ = settings_from_dict({}).storage.location
    with pytest.raises(SettingsError, match=re.escape("storage.url: Value error, bucket 'http://b' is not an s3://")):
        settings_from_dict({"storage": {"url": "http://b"}})
    with pytest.raises(ValidationError, match="region"):
        StorageSettings(region="Europe West")
