"""Run engine: 1 GiB upload and download over loopback against OpenSSH scp, and the engine's own overhead.

- transfer: the engine's SFTP path (1 MiB blocks, 128 requests in flight) vs ``scp`` of the same file, same sshd;
  "verified" adds the SHA-256 checks the engine always does (both ends hash the file).
- overhead: wall time of a whole run of the tiny model on the loopback sshd minus the payload's training time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from desktop.services.ssh_remote import Endpoint, RemoteMachine
from tests.benchmarks.common import Row, print_table
from tests.fixtures.sshd import SshHost, SshServer

SIZE = 1 << 30


def scp(host: SshHost, known_hosts: Path, source: str, target: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            "scp",
            "-q",
            "-i",
            str(host.client_key),
            "-P",
            str(host.port),
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            source,
            target,
        ],
        check=True,
    )
    return time.perf_counter() - start


async def ours(host: SshHost, local: Path, remote: Path, back: Path) -> dict[str, float]:
    machine = await RemoteMachine.connect(Endpoint(host.host, host.port, host.user, (host.client_key,)), None)
    timings = {}
    try:
        async with machine.conn.start_sftp_client() as sftp:  # the engine's copy loops, without the hashing
            start = time.perf_counter()
            await machine._upload_with(sftp, local, str(remote), None)
            timings["upload"] = time.perf_counter() - start
            start = time.perf_counter()
            await machine._download_with(sftp, str(remote), back, None, None)
            timings["download"] = time.perf_counter() - start
        await asyncio.to_thread(remote.unlink)
        await asyncio.to_thread(back.unlink)
        start = time.perf_counter()
        await machine.upload(local, str(remote))
        timings["upload_verified"] = time.perf_counter() - start
        start = time.perf_counter()
        await machine.download(str(remote), back)
        timings["download_verified"] = time.perf_counter() - start
    finally:
        await machine.close()
    return timings


def engine_overhead(folder: Path, server: SshServer) -> tuple[float, float]:
    from desktop.services.run_engine import EngineOptions, RunEngine, mirrored_events
    from desktop.services.run_store import RunStore
    from tests.fixtures.chat_data import write_chat_dataset
    from tests.fixtures.tiny_models import build_tiny_model
    from tests.runs.test_engine_end_to_end import load

    os.environ["RENTUNE_HOME"] = str(folder / "home")
    model = build_tiny_model(folder / "tiny")
    write_chat_dataset(folder / "chat.jsonl")
    host = server.host()
    spec = folder / "SPEC.toml"
    spec.write_text(
        f'[model]\nbase = "{model.path}"\n[data]\ntrain = "{folder / "chat.jsonl"}"\n[training]\nmethod = "lora"\n'
        "lora_r = 8\nseq_len = 128\nmicro_batch = 4\ngrad_accum = 1\nmax_steps = 40\ncheckpoint_steps = 10\n"
        f'checkpoint_minutes = 0\n[target]\nssh = "{host.url}"\nidentity = "{host.client_key}"\n'
        f'python = "{sys.executable}"\nworkdir = "{folder / "remote"}"\n'
        f'authorized_keys = "{server.directory / "authorized_keys"}"\n'
    )
    engine = RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2))
    record = engine.create(load(spec))
    start = time.perf_counter()
    asyncio.run(engine.drive(record.id))
    wall = time.perf_counter() - start
    done = next(e for e in mirrored_events(engine.folder(record.id)) if e["event"] == "done")
    return wall, wall - float(done["train_seconds"])


def run() -> bool:
    import statistics

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = SshServer(folder / "sshd")
        server.start()
        try:
            host = server.host()
            known = folder / "known_hosts"
            known.write_text(host.known_hosts_line + "\n")
            local = folder / "big.bin"
            with local.open("wb") as handle:
                for _ in range(SIZE // (64 << 20)):
                    handle.write(os.urandom(64 << 20))
            theirs: dict[str, list[float]] = {"upload": [], "download": []}
            mine_runs: list[dict[str, float]] = []
            for _ in range(2):  # interleaved: machine noise hits both alike
                theirs["upload"].append(scp(host, known, str(local), f"{host.user}@127.0.0.1:{folder / 'scp.bin'}"))
                theirs["download"].append(
                    scp(host, known, f"{host.user}@127.0.0.1:{folder / 'scp.bin'}", str(folder / "scp-down"))
                )
                (folder / "scp.bin").unlink()
                (folder / "scp-down").unlink()
                mine_runs.append(asyncio.run(ours(host, local, folder / "up.bin", folder / "down.bin")))
                (folder / "up.bin").unlink()
                (folder / "down.bin").unlink()
            local.unlink()
            wall, overhead = engine_overhead(folder, server)
        finally:
            server.stop()
    mine = {key: statistics.median(run[key] for run in mine_runs) for key in mine_runs[0]}
    theirs_up, theirs_down = statistics.median(theirs["upload"]), statistics.median(theirs["download"])
    gib = SIZE / 1e6
    print(
        f"1 GiB (medians of 2): scp up {theirs_up:.1f} s, down {theirs_down:.1f} s; engine up {mine['upload']:.1f} s,"
        f" down {mine['download']:.1f} s; with SHA-256 verification up {mine['upload_verified']:.1f} s, down "
        f"{mine['download_verified']:.1f} s. Tiny-model run: {wall:.1f} s wall, {overhead:.1f} s outside training"
    )
    up, down = theirs_up / mine["upload"], theirs_down / mine["download"]
    return print_table(
        [
            Row("upload speed vs scp (MB/s)", gib / mine["upload"], gib / theirs_up, "MB/s", "ratio >= 0.8", up >= 0.8),
            Row(
                "download speed vs scp (MB/s)",
                gib / mine["download"],
                gib / theirs_down,
                "MB/s",
                "ratio >= 0.8",
                down >= 0.8,
            ),
            Row(
                "verified upload vs scp (MB/s)",
                gib / mine["upload_verified"],
                gib / theirs_up,
                "MB/s",
                "reported",
                True,
            ),
            Row("engine overhead of a tiny run (s)", overhead, wall, "s", "reported", True),
        ]
    )
