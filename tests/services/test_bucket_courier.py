"""Checkpoints reach the bucket from the machine while the app is away: the links handed out ahead, the courier.

Against a real S3-compatible store (SeaweedFS). The "machine" is a folder on this computer whose commands run in a
real shell: the app's hand-out writes the links there and starts the real courier (``python -m trainer_payload
courier --detach``), which then sends each checkpoint the test seals there, as the trainer would, with no app call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from desktop.core.storage import StorageSettings
from desktop.services.buckets.mandate import planned_steps
from desktop.services.machines.ssh import CommandFailedError
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.bucket_checkpoints import keep_in_bucket, stays_in_bucket
from desktop.services.runs.bucket_courier import LEDGER_FILE_NAME, PID_FILE, rearm, withdraw
from desktop.services.runs.bucket_data import BUCKET_KEY
from desktop.services.runs.context import RunContext
from desktop.services.runs.engine import RunEngine
from desktop.services.runs.store import RunStore
from tests.fixtures.s3_server import S3Server
from trainer_payload.checkpoints import seal_checkpoint
from trainer_payload.courier import Courier, part_sizes
from trainer_payload.protocol import (
    CHECKPOINT_MARKER,
    COURIER_DIR_NAME,
    MANDATE_FILE_NAME,
    RECEIPTS_FILE_NAME,
    TRAINER_EXIT_FILE_NAME,
)

REPO = Path(__file__).resolve().parents[2]
BIG = 70 << 20  # two parts at 64 MiB: a multipart upload of more than one part


class ShellMachine:
    """This computer as the machine: each command runs in ``bash`` (``cd`` to the run's folder is the command's own)."""

    async def run(self, command: str, *, stdin: str | None = None, check: bool = True, time_limit: float = 300) -> str:
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate((stdin or "").encode()), time_limit)
        if check and process.returncode:
            raise CommandFailedError(command.split(maxsplit=1)[0], process.returncode or 1, err.decode())
        return out.decode()


def seal(root: Path, step: int, sizes: dict[str, int]) -> dict[str, Any]:
    """Writes and seals ``checkpoint-STEP`` on the machine as the trainer does; its checkpoint event."""
    folder = root / "out" / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(os.urandom(min(size, 1 << 20)) * (size >> 20) + os.urandom(size % (1 << 20)))
    marker = seal_checkpoint(folder, step)
    digests = {name: info["sha256"] for name, info in marker["files"].items()}
    return {"ts": 0.0, "seq": step, "event": "checkpoint", "step": step, "path": f"checkpoints/checkpoint-{step}",
            "bytes": sum(sizes.values()), "sha256": digests}  # fmt: skip


def links_handed_out(ctx: RunContext, run_id: str, root: Path, sizes: dict[str, int], total: int) -> None:
    """The app sends checkpoint-3 and hands out links; the real courier it started is stopped (the test steps one)."""
    assert asyncio.run(keep_in_bucket(ctx, run_id, ShellMachine(), seal(root, 3, sizes), total=total, poll=0.2))  # type: ignore[arg-type]
    os.kill(int((root / PID_FILE).read_text()), signal.SIGKILL)


@pytest.fixture
def bucket_run(s3_server: S3Server, tmp_path: Path) -> Iterator[tuple[RunContext, str, Path, list[str]]]:
    """A run with the store as its bucket and a checkpoint every 3 steps; its machine folder holds the payload."""
    storage = StorageSettings(url=f"s3://{s3_server.bucket}/team", endpoint=s3_server.endpoint)
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    lines: list[str] = []
    engine = RunEngine(RunStore(), SecretStore(), report=lines.append)
    root = tmp_path / "machine"
    (root / "payload").mkdir(parents=True)
    (root / "payload" / "trainer_payload").symlink_to(REPO / "trainer_payload")
    spec = {"base_model": "b", "training": {"checkpoint_steps": 3}, "python": sys.executable,
            BUCKET_KEY: storage.model_dump()}  # fmt: skip
    record = engine.store.create(spec, "ssh://u@h:22")
    engine.store.update(record.id, remote_dir=str(root))
    yield engine.ctx, record.id, root, lines
    pid = (root / PID_FILE).read_text().strip() if (root / PID_FILE).exists() else ""
    if pid.isdigit():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _wait_for(check: Any, seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not seen within {seconds} s")


def _whole_in_bucket(s3_server: S3Server, run_id: str, name: str, folder: Path) -> bool:
    """Whether the bucket holds the checkpoint's seal and every file it lists, byte for byte as on the machine."""
    client, prefix = s3_server.client(), f"team/runs/{run_id}/checkpoints/{name}"
    try:
        stored_seal = client.get_object(Bucket=s3_server.bucket, Key=f"{prefix}/{CHECKPOINT_MARKER}")["Body"].read()
    except client.exceptions.NoSuchKey:
        return False
    assert stored_seal == (folder / CHECKPOINT_MARKER).read_bytes()
    for file, info in json.loads(stored_seal)["files"].items():
        body = client.get_object(Bucket=s3_server.bucket, Key=f"{prefix}/{file}")["Body"].read()
        assert len(body) == info["bytes"] and hashlib.sha256(body).hexdigest() == info["sha256"], file
    return True


def test_the_machine_sends_checkpoints_to_the_bucket_by_itself_while_the_app_is_away(
    bucket_run: tuple[RunContext, str, Path, list[str]], s3_server: S3Server
) -> None:
    ctx, run_id, root, lines = bucket_run
    machine = ShellMachine()
    sizes = {"adapter_model.safetensors": BIG, "adapter_config.json": 120}
    first = seal(root, 3, sizes)
    assert asyncio.run(keep_in_bucket(ctx, run_id, machine, first, total=30, poll=0.2)) is True  # type: ignore[arg-type]
    assert "checkpoint checkpoint-3 is safe in the bucket" in "\n".join(lines)
    assert lines[-1] == "the machine sends its next 9 checkpoint(s) to the bucket itself, app or not"
    assert json.loads((root / "out" / COURIER_DIR_NAME / MANDATE_FILE_NAME).read_text())["checkpoints"].keys() == {
        f"checkpoint-{step}" for step in (6, 9, 12, 15, 18, 21, 24, 27, 30)
    }

    # The app is away now: no call of it from here until it comes back.
    checkpoints = root / "out" / "checkpoints"
    seal(root, 6, sizes)
    _wait_for(lambda: _whole_in_bucket(s3_server, run_id, "checkpoint-6", checkpoints / "checkpoint-6"))
    ninth = seal(root, 9, {**sizes, "adapter_model.safetensors": BIG + 5})  # a file grown a little: still sent
    _wait_for(lambda: _whole_in_bucket(s3_server, run_id, "checkpoint-9", checkpoints / "checkpoint-9"))
    receipts = [
        json.loads(line) for line in (root / "out" / COURIER_DIR_NAME / RECEIPTS_FILE_NAME).read_text().splitlines()
    ]
    assert [(r["name"], r["ok"]) for r in receipts] == [("checkpoint-6", True), ("checkpoint-9", True)]
    for path in root.rglob("*"):  # no bucket key on the machine's disk (the links name the key ID, as S3 requires)
        if path.is_file() and "payload" not in path.parts:
            assert s3_server.secret_key.encode() not in path.read_bytes(), f"the bucket's secret key is in {path}"
    pid = int((root / PID_FILE).read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert s3_server.secret_key.encode() not in environ and s3_server.access_key.encode() not in environ

    # The app comes back: the courier's receipt is checked against the bucket, not believed, and the links renewed.
    assert asyncio.run(keep_in_bucket(ctx, run_id, machine, ninth, total=30, poll=0.2)) is True  # type: ignore[arg-type]
    assert "checkpoint checkpoint-9 is safe in the bucket (sent by the machine)" in lines
    assert lines[-1] == "the machine sends its next 7 checkpoint(s) to the bucket itself, app or not"
    (root / "out" / TRAINER_EXIT_FILE_NAME).write_text("0\n")
    _wait_for(lambda: not Path(f"/proc/{pid}").exists() or b"Z" in Path(f"/proc/{pid}/stat").read_bytes().split()[2])

    asyncio.run(withdraw(ctx, run_id))  # the run ended: the uploads made for checkpoints it never wrote go
    assert lines[-1] == "ended 14 upload(s) made ahead for checkpoints the run did not write"
    assert not s3_server.client().list_multipart_uploads(Bucket=s3_server.bucket).get("Uploads")
    assert not (ctx.folder(run_id) / LEDGER_FILE_NAME).exists()
    for name in ("checkpoint-6", "checkpoint-9"):
        assert _whole_in_bucket(s3_server, run_id, name, checkpoints / name), "a completed upload is never aborted"


def test_a_checkpoint_the_courier_could_not_send_is_never_whole_in_the_bucket_and_the_app_sends_it(
    bucket_run: tuple[RunContext, str, Path, list[str]], s3_server: S3Server
) -> None:
    ctx, run_id, root, lines = bucket_run
    machine = ShellMachine()
    sizes = {"adapter_model.safetensors": BIG, "adapter_config.json": 120}
    links_handed_out(ctx, run_id, root, sizes, total=9)  # the courier then runs in-process, step by step
    mandate_path = root / "out" / COURIER_DIR_NAME / MANDATE_FILE_NAME
    mandate = json.loads(mandate_path.read_text())
    parts = mandate["checkpoints"]["checkpoint-6"]["files"]["adapter_model.safetensors"]["parts"]
    parts[1] = parts[1].replace("X-Amz-Signature=", "X-Amz-Signature=0")  # the store refuses the second part
    mandate_path.write_text(json.dumps(mandate))

    sixth = seal(root, 6, sizes)
    receipt = Courier(root / "out").sweep()
    assert receipt is not None and receipt["ok"] is False and "refused" in receipt["error"], receipt
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"team/runs/{run_id}/checkpoints/checkpoint-6/")
    stored = {item["Key"].rsplit("/", 1)[1] for item in listed.get("Contents", [])}
    assert stored == {"adapter_config.json"}, "the file sent before is there; the one cut short and the seal are not"
    assert not (root / "out" / COURIER_DIR_NAME / "staging" / "checkpoint-6").exists()

    assert asyncio.run(keep_in_bucket(ctx, run_id, machine, sixth, total=9, poll=0.2)) is True  # type: ignore[arg-type]
    assert any(line.startswith("the machine could not send checkpoint-6 itself") for line in lines)
    assert "checkpoint checkpoint-6 is safe in the bucket (s3://rentune-test/team)" in lines
    assert _whole_in_bucket(s3_server, run_id, "checkpoint-6", root / "out" / "checkpoints" / "checkpoint-6")


def test_the_courier_sends_nothing_it_has_no_links_for_and_nothing_once_they_expired(
    bucket_run: tuple[RunContext, str, Path, list[str]], s3_server: S3Server
) -> None:
    ctx, run_id, root, _lines = bucket_run
    sizes = {"adapter_model.safetensors": 1000, "adapter_config.json": 120}
    links_handed_out(ctx, run_id, root, sizes, total=12)
    seal(root, 6, {**sizes, "optimizer.pt": 10})  # a file the links were not made for
    receipt = Courier(root / "out").sweep()
    assert receipt is not None and receipt["ok"] is False and "do not cover optimizer.pt" in receipt["error"]
    seal(root, 7, sizes)  # a step nobody planned (a stop's checkpoint): the app sends it
    assert Courier(root / "out").sweep() is None
    seal(root, 9, sizes)
    assert Courier(root / "out", now=lambda: time.time() + 8 * 24 * 3600).sweep() == {
        "name": "checkpoint-9", "step": 9, "ok": False,
        "error": "the links expired (the app renews them while it follows the run)",
    }  # fmt: skip
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=f"team/runs/{run_id}/checkpoints/")
    assert {item["Key"].split("/")[4] for item in listed["Contents"]} == {"checkpoint-3"}


def test_a_machine_that_says_it_sent_a_checkpoint_is_checked_against_the_bucket(
    bucket_run: tuple[RunContext, str, Path, list[str]], s3_server: S3Server
) -> None:
    ctx, run_id, root, lines = bucket_run
    sizes = {"adapter_model.safetensors": 1000, "adapter_config.json": 120}
    links_handed_out(ctx, run_id, root, sizes, total=12)
    receipts = root / "out" / COURIER_DIR_NAME / RECEIPTS_FILE_NAME
    receipts.write_text(json.dumps({"name": "checkpoint-6", "step": 6, "ok": True}) + "\n")  # a lie: nothing sent
    sixth = seal(root, 6, sizes)
    assert asyncio.run(keep_in_bucket(ctx, run_id, ShellMachine(), sixth, total=12, poll=0.2)) is True  # type: ignore[arg-type]
    assert any(
        line.startswith("the machine said it sent checkpoint-6, but the bucket says otherwise") for line in lines
    )
    assert _whole_in_bucket(s3_server, run_id, "checkpoint-6", root / "out" / "checkpoints" / "checkpoint-6")


def test_a_new_machine_gets_fresh_links_and_uploads_aborted_meanwhile_are_made_again(
    bucket_run: tuple[RunContext, str, Path, list[str]], s3_server: S3Server
) -> None:
    ctx, run_id, root, _lines = bucket_run
    sizes = {"adapter_model.safetensors": 1000, "adapter_config.json": 120}
    links_handed_out(ctx, run_id, root, sizes, total=12)
    client = s3_server.client()
    for upload in client.list_multipart_uploads(Bucket=s3_server.bucket)["Uploads"]:  # e.g. a lifecycle rule
        client.abort_multipart_upload(Bucket=s3_server.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    (root / "out" / COURIER_DIR_NAME / MANDATE_FILE_NAME).unlink()

    asyncio.run(rearm(ctx, run_id, ShellMachine()))  # as on a resume: before the new machine's first checkpoint
    assert len(client.list_multipart_uploads(Bucket=s3_server.bucket)["Uploads"]) == 6, "checkpoints 6, 9, 12"
    seal(root, 6, sizes)
    _wait_for(
        lambda: _whole_in_bucket(s3_server, run_id, "checkpoint-6", root / "out" / "checkpoints" / "checkpoint-6")
    )


@pytest.mark.parametrize(
    ("size", "links", "parts"),
    [
        (0, 1, [0]),
        (100, 2, [100]),
        (BIG, 3, [64 << 20, 6 << 20]),
        (200 << 20, 2, [100 << 20, 100 << 20]),  # grown past its links: larger parts, still within them
    ],
)
def test_a_file_is_cut_into_at_most_its_links_parts(size: int, links: int, parts: list[int]) -> None:
    assert part_sizes(size, links) == parts


def test_the_links_cover_the_next_planned_checkpoints_and_the_last_step() -> None:
    assert planned_steps(3, 3, 10) == [6, 9, 10]
    assert planned_steps(7, 3, None, ahead=3) == [9, 12, 15]
    assert planned_steps(9, 3, 9) == []
    assert planned_steps(3, 0, 10) == []


def test_a_full_fine_tunes_checkpoints_stay_in_the_bucket_unless_the_settings_ask_them_home() -> None:
    bucket = StorageSettings(url="s3://my-bucket/p").model_dump()
    full = {"training": {"method": "full"}, BUCKET_KEY: bucket}
    assert stays_in_bucket(full)
    assert not stays_in_bucket({**full, BUCKET_KEY: {**bucket, "full_checkpoints_home": True}})
    assert not stays_in_bucket({**full, "training": {"method": "lora"}}), "adapters come home"
    assert not stays_in_bucket({"training": {"method": "full"}}), "without a bucket everything comes home"
