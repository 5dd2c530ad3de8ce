"""What is in the bucket, what it costs, and pruning to each run's newest whole checkpoints, against a real store
(SeaweedFS): an unsealed folder older than the newest whole one goes, the one being uploaded now stays, and a run's
newest whole checkpoint is never deleted; ``rentune storage ls|du|prune`` say it."""

from __future__ import annotations

import json

import pytest

from desktop.cli import main
from desktop.core.settings import Settings
from desktop.core.storage import StorageSettings
from desktop.services.buckets.client import BucketKeys
from desktop.services.buckets.inventory import bucket_usage, prune_bucket
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.platform.settings import save_settings
from tests.fixtures.s3_server import S3Server
from trainer_payload.protocol import CHECKPOINT_MARKER

MB = 1_000_000


def put_checkpoint(server: S3Server, run: str, step: int, size: int, *, whole: bool) -> None:
    client, root = server.client(), f"team/runs/{run}/checkpoints/checkpoint-{step}"
    client.put_object(Bucket=server.bucket, Key=f"{root}/adapter_model.safetensors", Body=b"w" * size)
    if whole:
        client.put_object(Bucket=server.bucket, Key=f"{root}/{CHECKPOINT_MARKER}", Body=b'{"files": {}}')


def stored(server: S3Server, run: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=server.bucket, Prefix=f"team/runs/{run}/checkpoints/")
    return sorted({item["Key"].split("/")[4] for item in listed.get("Contents", [])})


def test_prune_keeps_each_runs_newest_whole_checkpoints_and_the_one_being_uploaded(s3_server: S3Server) -> None:
    for step, whole in [(1, False), (3, True), (6, True), (9, True), (12, False)]:
        put_checkpoint(s3_server, "run-a", step, MB, whole=whole)
    put_checkpoint(s3_server, "run-b", 5, 2 * MB, whole=True)
    s3_server.client().put_object(Bucket=s3_server.bucket, Key="team/data/sha256/ab/train.jsonl", Body=b"d" * MB)
    storage = StorageSettings(url=f"s3://{s3_server.bucket}/team", endpoint=s3_server.endpoint)
    keys = BucketKeys(s3_server.access_key, s3_server.secret_key)
    usage = bucket_usage(storage, keys)
    assert usage.data_bytes == MB and usage.total_bytes > 8 * MB
    assert usage.monthly_usd(0.023) == pytest.approx(usage.total_bytes / 1e9 * 0.023)
    assert prune_bucket(storage, keys, keep=2) == (2, 2 * MB + len(b'{"files": {}}'))
    assert stored(s3_server, "run-a") == ["checkpoint-12", "checkpoint-6", "checkpoint-9"], "12 is being uploaded"
    assert stored(s3_server, "run-b") == ["checkpoint-5"]
    assert prune_bucket(storage, keys, keep=0, run_id="run-b") == (0, 0), "the newest whole one always stays"


def test_rentune_storage_ls_du_and_prune_say_what_is_there_and_what_goes(
    s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    save_settings(Settings(storage=StorageSettings(url=f"s3://{s3_server.bucket}/team", endpoint=s3_server.endpoint,
                                                   price_per_gb_month=0.006)))  # fmt: skip
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    for step in (3, 6):
        put_checkpoint(s3_server, "run-a", step, 5 * MB, whole=True)
    assert main(["storage", "ls"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "run-a" and "checkpoint-3" in out and "5.0 MB  whole" in out
    assert main(["storage", "du", "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)
    assert totals["checkpoints_bytes"] > 10 * MB and totals["monthly_usd"] == round(
        totals["total_bytes"] / 1e9 * 0.006, 4
    )
    assert main(["storage", "prune", "--keep", "0"]) == 2
    assert "--keep must be at least 1" in capsys.readouterr().err
    assert main(["storage", "set", "s3://my-bucket/x", "--keep", "0"]) == 2
    assert "--keep must be from 1 to 1000: a run's newest whole checkpoint always stays" in capsys.readouterr().err
    assert main(["storage", "prune", "--keep", "1"]) == 0
    assert capsys.readouterr().out.startswith("deleted 1 checkpoint(s), 5.0 MB; each run keeps its newest 1")
    assert stored(s3_server, "run-a") == ["checkpoint-6"]
    assert main(["storage", "rm", "run-a"]) == 0
    assert capsys.readouterr().out.startswith("deleted 1 checkpoint(s) of run run-a from the bucket, 5.0 MB")
    assert stored(s3_server, "run-a") == []
