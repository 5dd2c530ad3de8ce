"""The user's bucket against a real S3-compatible store (SeaweedFS on loopback) with boto3: the check writes, reads
back and deletes a test object and leaves nothing; wrong keys, a missing bucket, an unreachable endpoint and missing
keys each get one line naming the fix; ``rentune storage`` sets the bucket up, shows it and checks it, and the keys
stay in the keyring (never in the settings file)."""

from __future__ import annotations

import json
import re
import socket

import pytest

from desktop.cli import main
from desktop.core.storage import StorageSettings
from desktop.services.buckets.check import CHECK_FOLDER, check_bucket
from desktop.services.buckets.client import BucketError, BucketKeys, bucket_keys
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretName, SecretStore
from tests.fixtures.s3_server import S3Server


def settings_for(server: S3Server, prefix: str = "team/rentune") -> StorageSettings:
    return StorageSettings(url=f"s3://{server.bucket}/{prefix}", endpoint=server.endpoint, region=server.region)


def keys_for(server: S3Server) -> BucketKeys:
    return BucketKeys(server.access_key, server.secret_key)


def test_the_check_writes_reads_back_and_deletes_a_test_object_and_leaves_nothing(s3_server: S3Server) -> None:
    result = check_bucket(settings_for(s3_server), keys_for(s3_server))
    assert set(result.seconds) == {"write", "read", "delete"}
    assert result.words().startswith(
        f"wrote, read back and deleted a test object in s3://{s3_server.bucket}/team/rentune at {s3_server.endpoint} ("
    )
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=f"team/rentune/{CHECK_FOLDER}/")
    assert listed.get("KeyCount", 0) == 0, "the test object is gone"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_each_way_the_bucket_cannot_be_used_gets_one_line_with_the_fix(s3_server: S3Server) -> None:
    storage, keys = settings_for(s3_server), keys_for(s3_server)
    cases = [
        (storage, BucketKeys(keys.key_id, "x" * 40), "the bucket's secret key does not match its access key ID"),
        (storage, BucketKeys("AKIAUNKNOWN000000000", keys.secret), "does not know the bucket's access key ID"),
        (storage.model_copy(update={"url": "s3://no-such-bucket/x"}), keys, "bucket no-such-bucket does not exist at"),
        (storage.model_copy(update={"endpoint": f"http://127.0.0.1:{closed_port()}"}), keys, "cannot reach http://"),
    ]
    for settings, given, words in cases:
        with pytest.raises(BucketError, match=re.escape(words)) as caught:
            check_bucket(settings, given)
        assert "Traceback" not in str(caught.value) and keys.secret not in str(caught.value)
    listed = s3_server.client().list_buckets()["Buckets"]
    assert [bucket["Name"] for bucket in listed] == [s3_server.bucket], "the check made no bucket of its own"


def test_missing_keys_are_named_with_where_to_set_them() -> None:
    with pytest.raises(BucketError, match=re.escape("no Bucket access key ID is set: save it under API keys")):
        bucket_keys(SecretStore())
    SecretStore().set(SecretName.BUCKET_KEY_ID, "AKIAEXAMPLE")
    with pytest.raises(BucketError, match=re.escape("`rentune keys set bucket-secret`, or set RENTUNE_BUCKET_SECRET")):
        bucket_keys(SecretStore())


def test_rentune_storage_sets_up_shows_and_checks_the_bucket_with_the_keys_in_the_keyring_only(
    s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["storage", "check"]) == 2
    assert "no bucket is set up: rentune storage set s3://BUCKET/PREFIX" in capsys.readouterr().err
    assert main(["storage", "set", "s3://Bad_Bucket", "--endpoint", s3_server.endpoint]) == 2
    assert "bucket name 'Bad_Bucket' is not one S3 takes" in capsys.readouterr().err
    url = f"s3://{s3_server.bucket}/rentune/"
    assert main(["storage", "set", url, "--endpoint", s3_server.endpoint, "--region", "US-East-1"]) == 0
    assert f"bucket set: s3://{s3_server.bucket}/rentune at {s3_server.endpoint}, region us-east-1" in (
        capsys.readouterr().out
    )
    assert main(["storage", "check"]) == 1
    assert "the bucket check failed: no Bucket access key ID is set" in capsys.readouterr().err
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    assert main(["storage", "check", "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["url"] == f"s3://{s3_server.bucket}/rentune" and set(checked["seconds"]) == {
        "write",
        "read",
        "delete",
    }
    assert main(["storage", "show"]) == 0
    shown = capsys.readouterr().out
    assert "Bucket access key ID  keyring" in shown and "Bucket secret key     keyring" in shown
    assert "full fine-tunes' checkpoints stay in the bucket (adapters come home)" in shown
    settings_text = app_paths().settings_file.read_text()
    assert s3_server.secret_key not in settings_text + shown and s3_server.access_key not in settings_text + shown
    assert json.loads(settings_text)["storage"]["url"] == f"s3://{s3_server.bucket}/rentune"
