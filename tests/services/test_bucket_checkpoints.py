"""A checkpoint's upload from the machine to the bucket, against a real S3-compatible store (SeaweedFS): the machine
sends presigned parts with the real ``trainer_payload push``; a machine killed mid-upload leaves no checkpoint that
looks whole and no unfinished upload costing storage, and the bucket's newest whole checkpoint stays the older one."""

from __future__ import annotations

import asyncio
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from desktop.core.storage import StorageSettings
from desktop.services.buckets.checkpoints import newest_checkpoint_links
from desktop.services.buckets.client import BucketKeys
from desktop.services.machines.ssh import RemoteError
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.bucket_checkpoints import keep_in_bucket
from desktop.services.runs.bucket_data import BUCKET_KEY
from desktop.services.runs.context import RunContext
from desktop.services.runs.engine import RunEngine
from desktop.services.runs.store import RunStore
from tests.fixtures.s3_server import S3Server
from trainer_payload.checkpoints import seal_checkpoint
from trainer_payload.protocol import CHECKPOINT_MARKER
from trainer_payload.push import run_push


class LocalMachine:
    """The run's folder on this computer as the machine: ``cat`` reads it, ``push`` runs the real payload's push.

    ``dies_after_parts``: the machine is killed once that many parts reached the bucket (the push's plan cut there,
    then the connection drops without an answer).
    """

    def __init__(self, root: Path, dies_after_parts: int | None = None) -> None:
        self.root, self.dies_after_parts, self.pushed_parts = root, dies_after_parts, 0

    async def run(self, command: str, *, stdin: str | None = None, check: bool = True, time_limit: float = 300) -> str:
        if command.startswith("cat "):
            return await asyncio.to_thread(Path(command.split(" ", 1)[1].strip("'")).read_text)
        assert "trainer_payload push" in command and stdin is not None
        plan = json.loads(stdin)
        if self.dies_after_parts is not None:
            plan = {"files": [{**plan["files"][0], "parts": plan["files"][0]["parts"][: self.dies_after_parts]}]}
        out = io.StringIO()
        with redirect_stdout(out):
            await asyncio.to_thread(run_push, io.StringIO(json.dumps(plan)), self.root)
        self.pushed_parts = sum(len(item["parts"]) for item in plan["files"])
        if self.dies_after_parts is not None:
            raise RemoteError("`push` ended without an exit status (signal: none)")
        return out.getvalue()


def checkpoint(root: Path, step: int, sizes: dict[str, int]) -> dict[str, Any]:
    folder = root / "out" / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(bytes([step % 256]) * size)
    marker = seal_checkpoint(folder, step)
    digests = {name: info["sha256"] for name, info in marker["files"].items()}
    return {"ts": 0.0, "seq": step, "event": "checkpoint", "step": step, "path": f"checkpoints/checkpoint-{step}",
            "bytes": sum(sizes.values()), "sha256": digests}  # fmt: skip


def test_a_machine_killed_mid_upload_leaves_no_whole_checkpoint_and_no_unfinished_upload(
    s3_server: S3Server, tmp_path: Path
) -> None:
    storage = StorageSettings(url=f"s3://{s3_server.bucket}/team", endpoint=s3_server.endpoint, keep_checkpoints=1)
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    lines: list[str] = []
    engine = RunEngine(RunStore(), SecretStore(), report=lines.append)
    root = tmp_path / "machine"
    spec = {"base_model": "b", "training": {}, "python": "python3", BUCKET_KEY: storage.model_dump()}
    record = engine.store.create(spec, "ssh://u@h:22")
    engine.store.update(record.id, remote_dir=str(root))
    ctx: RunContext = engine.ctx
    big = 70 << 20  # two parts of 64 MiB and a rest: a multipart upload in three parts
    first = checkpoint(root, 3, {"adapter_model.safetensors": big, "adapter_config.json": 120})
    assert asyncio.run(keep_in_bucket(ctx, record.id, LocalMachine(root), first, total=None, poll=0.1)) is True  # type: ignore[arg-type]
    assert lines[-1] == f"checkpoint checkpoint-3 is safe in the bucket (s3://{s3_server.bucket}/team)"

    second = checkpoint(root, 6, {"adapter_model.safetensors": big, "adapter_config.json": 120})
    dying = LocalMachine(root, dies_after_parts=1)
    assert asyncio.run(keep_in_bucket(ctx, record.id, dying, second, total=None, poll=0.1)) is False  # type: ignore[arg-type]
    assert dying.pushed_parts == 1 and lines[-1].startswith("checkpoint checkpoint-6 did not go to the bucket (`push`")
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"team/runs/{record.id}/checkpoints/checkpoint-6/")
    assert listed.get("KeyCount", 0) == 0, "nothing of the killed upload is visible: no seal, no file"
    assert not client.list_multipart_uploads(Bucket=s3_server.bucket).get("Uploads"), "its parts were aborted"
    newest, links = newest_checkpoint_links(storage, BucketKeys(s3_server.access_key, s3_server.secret_key), record.id)
    assert newest is not None and newest.name == "checkpoint-3", "a resume starts from the last whole checkpoint"
    assert [link["path"].rsplit("/", 1)[1] for link in links][-1] == CHECKPOINT_MARKER, "the seal comes last"
    seal = json.loads((root / "out/checkpoints/checkpoint-3" / CHECKPOINT_MARKER).read_text())
    assert newest.files == {n: (i["bytes"], i["sha256"]) for n, i in seal["files"].items()}

    third = checkpoint(root, 9, {"adapter_model.safetensors": 1000, "adapter_config.json": 120})
    assert asyncio.run(keep_in_bucket(ctx, record.id, LocalMachine(root), third, total=None, poll=0.1)) is True  # type: ignore[arg-type]
    assert lines[-1].startswith("deleted 1 older checkpoint(s) from the bucket") and lines[-1].endswith("newest 1 stay")
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"team/runs/{record.id}/checkpoints/")
    assert {item["Key"].split("/")[4] for item in listed["Contents"]} == {"checkpoint-9"}, "keep 1: the newest"
