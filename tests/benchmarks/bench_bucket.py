"""A checkpoint's upload from the machine to the bucket against boto3's own multipart upload of the same files.

Two paths of ours: the app-driven push, and the machine's courier sending alone with links made ahead.

A real S3-compatible store (SeaweedFS on loopback). Ours: the app starts the multipart uploads and presigns the parts
(``begin_checkpoint_upload``), the machine's ``trainer_payload push`` sends them with urllib (in a child process, as
on the machine), the app completes them (``finish_checkpoint_upload``). The baseline: boto3's ``upload_file`` of the
same files with the same part size, from the same disk, one part at a time (the push sends one at a time too).
Best of three interleaved runs of each; the target is at least 0.9x the baseline's MB/s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from boto3.s3.transfer import TransferConfig

from desktop.core.storage import StorageSettings
from desktop.services.buckets.checkpoints import PART_BYTES, begin_checkpoint_upload, finish_checkpoint_upload
from desktop.services.buckets.client import BucketKeys
from desktop.services.buckets.mandate import Ledger, issue_links
from tests.benchmarks.common import Row, print_table
from tests.fixtures.s3_server import S3Server, start_s3_server
from trainer_payload.checkpoints import seal_checkpoint

FILES = {"model-00001.safetensors": 160 << 20, "model-00002.safetensors": 90 << 20, "config.json": 2_000}
RUNS = 3


def ours(server: S3Server, root: Path, run: int) -> float:
    """Seconds for the push path: plan, the machine's parts, completion."""
    settings = StorageSettings(url=f"s3://{server.bucket}/bench", endpoint=server.endpoint)
    keys = BucketKeys(server.access_key, server.secret_key)
    started = time.perf_counter()
    client, upload = begin_checkpoint_upload(
        settings, keys, "bench", name=f"checkpoint-{run}", folder="out/checkpoints/c", sizes=FILES
    )
    pushed = subprocess.run(
        [sys.executable, "-m", "trainer_payload", "push"], input=json.dumps(upload.plan), capture_output=True,
        text=True, cwd=root, check=True,
    )  # fmt: skip
    etags = {item["path"]: item["etags"] for item in json.loads(pushed.stdout.strip().splitlines()[-1])["files"]}
    finish_checkpoint_upload(client, settings.location, upload, etags, b'{"files": {}}')
    return time.perf_counter() - started


def courier(server: S3Server, root: Path, run: int) -> float:
    """Seconds for the machine's courier to send a sealed checkpoint with links made ahead (as while the app is away).

    The links are made before the checkpoint exists, as in a run: only the courier's sending is timed.
    """
    settings = StorageSettings(url=f"s3://{server.bucket}/bench", endpoint=server.endpoint)
    client = server.client()
    step = run + 1
    folder = root / f"out/checkpoints/checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in FILES:
        os.link(root / "out/checkpoints/c" / name, folder / name)
    seal_checkpoint(folder, step)
    mandate, _dropped = issue_links(client, settings.location, "courier", Ledger(sizes=dict(FILES)), [step])
    (root / "out/courier").mkdir(parents=True, exist_ok=True)
    (root / "out/courier/mandate.json").write_text(json.dumps(mandate))
    started = time.perf_counter()
    sent = subprocess.run(
        [sys.executable, "-c", "import json, pathlib; from trainer_payload.courier import Courier; "
         "print(json.dumps(Courier(pathlib.Path('out')).sweep()))"],
        capture_output=True, text=True, cwd=root, check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    receipt = json.loads(sent.stdout.strip().splitlines()[-1])
    assert receipt["ok"], receipt
    return seconds


def baseline(server: S3Server, root: Path, run: int) -> float:
    """Seconds for boto3's own multipart upload of the same files, part size alike, one part at a time."""
    client = server.client()
    config = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=1)
    started = time.perf_counter()
    for name in FILES:
        client.upload_file(str(root / "out/checkpoints/c" / name), server.bucket, f"boto/{run}/{name}", Config=config)
    return time.perf_counter() - started


def run() -> bool:
    """Prints the table; True when the push path reaches 0.9x boto3's throughput."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "machine"
        folder = root / "out/checkpoints/c"
        folder.mkdir(parents=True)
        for name, size in FILES.items():
            (folder / name).write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        server = start_s3_server(Path(tmp) / "s3")
        try:
            times: dict[str, list[float]] = {"ours": [], "courier": [], "boto3": []}
            for attempt in range(RUNS):
                times["ours"].append(ours(server, root, attempt))
                times["courier"].append(courier(server, root, attempt))
                times["boto3"].append(baseline(server, root, attempt))
        finally:
            server.stop()
    megabytes = sum(FILES.values()) / 1e6
    mine, alone, theirs = (megabytes / min(times[key]) for key in ("ours", "courier", "boto3"))
    print(f"{megabytes:.0f} MB in 64 MiB parts; " + ", ".join(
        f"{key} {', '.join(f'{t:.2f}' for t in spent)} s" for key, spent in times.items()))  # fmt: skip
    pushed = Row("checkpoint push MB/s / boto3 multipart MB/s", mine, theirs, "MB/s", ">= 0.9x", mine >= 0.9 * theirs)
    sent = Row("courier (app away) MB/s / boto3 MB/s", alone, theirs, "MB/s", ">= 0.9x", alone >= 0.9 * theirs)
    return print_table([pushed, sent])
