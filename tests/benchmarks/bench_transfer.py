"""Run engine: 512 MiB upload and download over loopback against OpenSSH scp, and the engine's own overhead.

- transfer: the engine's copies against ``scp`` of the same file to the same sshd, interleaved, best of five rounds
  each (on a shared machine interference only ever slows a run down, so the fastest is the fairest estimate).
  "verified upload" is what the engine does with a large file: OpenSSH's sftp copies it while the app hashes it and
  the remote checks it segment by segment. "built-in client" rows are asyncssh's copy loop (server-sized requests
  in flight, a worker thread reading the file), which copies small files, and everything on Windows or without
  OpenSSH: reported, as its speed is bound by asyncssh building each packet in Python. The download is asyncssh's,
  hashed as it is written and checked against the remote's SHA-256.
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

from desktop.services.machines.ssh import Endpoint, RemoteMachine
from tests.benchmarks.common import Row, print_table
from tests.fixtures.sshd import SshHost, SshServer

SIZE = 512 << 20
ROUNDS = 5


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
        async with machine.conn.start_sftp_client() as sftp:  # the engine's copy loops, without the remote checks
            start = time.perf_counter()
            await machine._upload_with(sftp, local, str(remote), None)
            timings["upload"] = time.perf_counter() - start
            start = time.perf_counter()
            await machine._download_with(sftp, str(remote), back, None, None)
            timings["download"] = time.perf_counter() - start
        await asyncio.to_thread(remote.unlink)
        await asyncio.to_thread(back.unlink)
        start = time.perf_counter()
        await machine.upload(local, str(remote))  # large: OpenSSH's sftp copies, the app hashes and checks
        timings["upload_verified"] = time.perf_counter() - start
        await asyncio.to_thread(remote.unlink)
        machine._openssh = None  # as on Windows or without OpenSSH: asyncssh copies
        start = time.perf_counter()
        await machine.upload(local, str(remote))
        timings["upload_verified_builtin"] = time.perf_counter() - start
        start = time.perf_counter()
        await machine.download(str(remote), back)
        timings["download_verified"] = time.perf_counter() - start
    finally:
        await machine.close()
    return timings


def transfer_rounds(folder: Path, host: SshHost) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Times scp and the engine ROUNDS times, interleaved so machine noise hits both alike."""
    known = folder / "known_hosts"
    known.write_text(host.known_hosts_line + "\n")
    local = folder / "big.bin"
    with local.open("wb") as handle:
        for _ in range(SIZE // (64 << 20)):
            handle.write(os.urandom(64 << 20))
    theirs: dict[str, list[float]] = {"upload": [], "download": []}
    mine: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        theirs["upload"].append(scp(host, known, str(local), f"{host.user}@127.0.0.1:{folder / 'scp.bin'}"))
        theirs["download"].append(scp(host, known, f"{host.user}@127.0.0.1:{folder / 'scp.bin'}", str(folder / "d")))
        (folder / "scp.bin").unlink()
        (folder / "d").unlink()
        for key, seconds in asyncio.run(ours(host, local, folder / "up.bin", folder / "down.bin")).items():
            mine.setdefault(key, []).append(seconds)
        (folder / "up.bin").unlink()
        (folder / "down.bin").unlink()
    local.unlink()
    return theirs, mine


def engine_overhead(folder: Path, server: SshServer) -> tuple[float, float]:
    from desktop.services.runs.engine import EngineOptions, RunEngine
    from desktop.services.runs.events import mirrored_events
    from desktop.services.runs.store import RunStore
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
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = SshServer(folder / "sshd")
        server.start()
        try:
            theirs, mine = transfer_rounds(folder, server.host())
            wall, overhead = engine_overhead(folder, server)
        finally:
            server.stop()
    for name, runs in [*(("scp " + k, v) for k, v in theirs.items()), *mine.items()]:
        print(f"{name:<20} runs (s): " + ", ".join(f"{r:.2f}" for r in runs))
    mb = SIZE / 1e6
    best = {key: mb / min(runs) for key, runs in mine.items()}
    scp_up, scp_down = mb / min(theirs["upload"]), mb / min(theirs["download"])
    print(f"Tiny-model run: {wall:.1f} s wall, {overhead:.1f} s outside training")

    def row(name: str, ours: float, baseline: float, least: float | None) -> Row:
        target = f"ratio >= {least}" if least else "reported"
        return Row(name, ours, baseline, "MB/s", target, least is None or ours / baseline >= least)

    return print_table(
        [
            row("verified upload vs scp (MB/s)", best["upload_verified"], scp_up, 0.9),
            row("download speed vs scp (MB/s)", best["download"], scp_down, 0.8),
            row("built-in client upload vs scp (MB/s)", best["upload"], scp_up, None),
            row("built-in client verified upload (MB/s)", best["upload_verified_builtin"], scp_up, None),
            row("verified download vs scp (MB/s)", best["download_verified"], scp_down, None),
            Row("engine overhead of a tiny run (s)", overhead, wall, "s", "reported", True),
        ]
    )
