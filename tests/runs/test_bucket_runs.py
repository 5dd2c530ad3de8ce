"""A rented run with a bucket set up: its data goes to the bucket once, from this computer, and each machine of the
run (the first, and the one a resume rents) reads it from there through a presigned link, verified, with no bucket
key on the machine. Against the fake RunPod (real sshd machines) and a real S3-compatible store (SeaweedFS)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.core.storage import StorageSettings
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.platform.settings import save_settings
from desktop.services.runs.engine import RunEngine
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fixtures.s3_server import S3Server
from tests.runs.test_rented_runs import (  # noqa: F401 - fixtures
    CloudUnderTest,
    SpecWriter,
    _create,
    _driver,
    _nothing_left,
    rented_spec,
    runpod,
)
from trainer_payload.protocol import EventKind

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def stopped_after_a_checkpoint(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture imported above
    rented_spec: SpecWriter,  # noqa: F811 - the fixture imported above
    s3_server: S3Server,
) -> tuple[RunEngine, str]:
    """A rented run with the store as its bucket, stopped (cancelled) once a checkpoint is home."""
    storage = StorageSettings(url=f"s3://{s3_server.bucket}/team", endpoint=s3_server.endpoint)
    save_settings(Settings(storage=storage))
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    engine, driver = _driver()
    run_id = _create(
        engine, rented_spec(runpod, training={"max_steps": 400, "checkpoint_steps": 3, "keep_checkpoints": 100})
    )
    folder = engine.folder(run_id)

    async def stop_after_a_checkpoint() -> RunState:
        drive = asyncio.ensure_future(driver.drive(run_id))
        for _ in range(3000):
            if list(folder.glob("checkpoints/checkpoint-*/rentune_checkpoint.json")):
                break
            await asyncio.sleep(0.1)
        await engine.request_stop(run_id)
        return (await drive).state

    assert asyncio.run(stop_after_a_checkpoint()) is RunState.CANCELLED
    return engine, run_id


def resumed_to_the_end(engine: RunEngine, run_id: str, max_steps: int) -> RunState:
    """Resumes the stopped run on a newly rented machine until step ``max_steps``; its final state."""
    stopped = RunStore().get(run_id)
    RunStore().update(run_id, spec={**stopped.spec, "training": {**stopped.spec["training"], "max_steps": max_steps}})
    engine.prepare_resume(run_id)
    _engine, second_driver = _driver()
    return asyncio.run(second_driver.drive(run_id)).state


def test_the_data_goes_to_the_bucket_once_and_both_machines_of_a_resumed_run_read_it_there(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture imported above
    rented_spec: SpecWriter,  # noqa: F811 - the fixture imported above
    s3_server: S3Server,
    chat_dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, run_id = stopped_after_a_checkpoint(runpod, rented_spec, s3_server)
    folder = engine.folder(run_id)
    first_out = capsys.readouterr().out
    end = max(e["step"] for e in mirrored_events(folder) if e["event"] is EventKind.CHECKPOINT) + 2
    assert resumed_to_the_end(engine, run_id, end) is RunState.FINISHED
    second_out = capsys.readouterr().out

    digest = hashlib.sha256(chat_dataset.read_bytes()).hexdigest()
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix="team/data/")["Contents"]
    assert [item["Key"] for item in listed] == [f"team/data/sha256/{digest}/{chat_dataset.name}"]
    _first, second = runpod.fake.instances.values()
    assert listed[0]["LastModified"].timestamp() < second.created, "stored before the second machine was rented"
    assert "sent the data to the bucket once" in first_out and "sent the data" not in second_out
    assert "the data is in the bucket already" in second_out
    for out in (first_out, second_out):
        assert "the machine read the data from the bucket" in out and "goes over SSH instead" not in out
    assert s3_server.secret_key not in first_out + second_out
    _nothing_left(runpod.fake)
    for path in tmp_path.rglob("*"):  # the machines' folders, the run's home; not the store's own identities
        if path.is_file() and s3_server.folder not in path.parents:
            assert s3_server.secret_key.encode() not in path.read_bytes(), f"the bucket's secret key is in {path}"


def test_checkpoints_go_from_the_machine_to_the_bucket_and_a_resume_elsewhere_starts_from_the_buckets_newest(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture imported above
    rented_spec: SpecWriter,  # noqa: F811 - the fixture imported above
    s3_server: S3Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json
    import shutil

    engine, run_id = stopped_after_a_checkpoint(runpod, rented_spec, s3_server)
    folder = engine.folder(run_id)
    first_out = capsys.readouterr().out
    assert "is safe in the bucket" in first_out, first_out[-3000:]
    client = s3_server.client()
    root = f"team/runs/{run_id}/checkpoints/"
    keys = [item["Key"] for item in client.list_objects_v2(Bucket=s3_server.bucket, Prefix=root)["Contents"]]
    seals = sorted(  # by step, not by name: checkpoint-12 is newer than checkpoint-3
        (key for key in keys if key.endswith("/rentune_checkpoint.json")), key=lambda k: int(k.split("/")[-2][11:])
    )
    assert seals, keys
    newest = seals[-1].removeprefix(root).split("/")[0]
    seal = json.loads(client.get_object(Bucket=s3_server.bucket, Key=seals[-1])["Body"].read())
    for name, info in seal["files"].items():  # every file the seal lists is there, whole, with its digest
        body = client.get_object(Bucket=s3_server.bucket, Key=f"{root}{newest}/{name}")["Body"].read()
        assert len(body) == info["bytes"] and hashlib.sha256(body).hexdigest() == info["sha256"], name
    assert not client.list_multipart_uploads(Bucket=s3_server.bucket).get("Uploads"), "no upload left unfinished"

    shutil.rmtree(folder / "checkpoints")  # nothing at home: the bucket's copy is all there is
    assert resumed_to_the_end(engine, run_id, int(newest.split("-")[1]) + 2) is RunState.FINISHED
    assert f"resuming from {newest} in the bucket (fetched by the machine, verified)" in capsys.readouterr().out
    training = [e for e in mirrored_events(folder) if e["event"] is EventKind.STATE and e["state"] == "training"]
    assert training[-1]["resume_from"] == newest, "the new machine trained on from the bucket's checkpoint"
    for path in tmp_path.rglob("*"):
        if path.is_file() and s3_server.folder not in path.parents:
            assert s3_server.secret_key.encode() not in path.read_bytes(), f"the bucket's secret key is in {path}"
    _nothing_left(runpod.fake)
