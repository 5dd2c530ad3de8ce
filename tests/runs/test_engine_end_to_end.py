"""The run engine against a real sshd with the real payload training the tiny model on the CPU."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.services.platform.settings import save_settings
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.fixtures.secret_watch import ArgvWatch
from tests.fixtures.sshd import SshHost, SshServer
from tests.runs.conftest import SpecFactory, python_wrapper, with_python

pytestmark = pytest.mark.slow


def engine(**options: float) -> RunEngine:
    return RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2, **options))  # type: ignore[arg-type]


def load(spec_path: Path):  # type: ignore[no-untyped-def]
    import tomllib

    from desktop.core.runs.spec import run_spec_from_dict

    return run_spec_from_dict(tomllib.loads(spec_path.read_text()), spec_path.parent, spec_path)


def assert_contiguous(folder: Path) -> list[dict]:  # type: ignore[type-arg]
    events = mirrored_events(folder)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "no gap and no duplicate"
    return events


async def wait_local_event(folder: Path, predicate, limit_s: float = 600) -> None:  # type: ignore[no-untyped-def]
    """Waits until a mirrored event matches; the limit is only a safety net (a loaded machine trains slowly)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if any(predicate(e) for e in mirrored_events(folder)):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"event never mirrored in {limit_s:.0f} s")


def test_rentune_run_trains_and_brings_home_a_verified_adapter(
    ssh_host: SshHost,
    make_spec: SpecFactory,
    capsys: pytest.CaptureFixture[str],
    memory_keyring: MemoryKeyring,
    rentune_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    token_probe: tuple[Path, Path],
) -> None:
    token = "hf_" + "SuperSecretTokenValue1234567890"
    monkeypatch.setenv("HF_TOKEN", token)
    from desktop.services.platform.logs import configure_logging

    configure_logging("DEBUG")  # the most the app ever writes
    save_settings(Settings(keep_local_checkpoints=1))
    wrapper, seen = token_probe
    spec = make_spec(ssh_host)
    spec.write_text(spec.read_text().replace(f'python = "{sys.executable}"', f'python = "{wrapper}"'))
    with ArgvWatch(token) as watch:
        assert main(["run", str(spec)]) == 0
    assert watch.samples > 10 and not watch.leaks, f"the token was seen: {watch.leaks[:3]}"
    # The wrapper sees the bootstrap; the trainer then runs on the run's venv interpreter (not the wrapper) and gets
    # its stdin from the same _token_stdin, so one "absent" covers both.
    assert seen.read_text().split() == ["absent"], "the machine got the token for a local model"
    for root in (rentune_home, tmp_path / "remote"):
        for path in root.rglob("*"):
            assert not (path.is_file() and token.encode() in path.read_bytes()), f"token found in {path}"
    out = capsys.readouterr().out
    assert "pinned host key" in out and "adapter verified" in out
    assert main(["runs", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert len(runs) == 1 and runs[0]["state"] == "finished"
    adapter = Path(runs[0]["adapter"])
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "adapter_config.json").is_file()
    folder = adapter.parent
    events = assert_contiguous(folder)
    assert events[-1]["state"] == "done"
    written = [e for e in events if e["event"] == "checkpoint"]
    kept = [p.name for p in (folder / "checkpoints").glob("checkpoint-*")]
    assert len(written) >= 3 and kept == [Path(written[-1]["path"]).name], "pulled while training, the newest kept"
    authorized = (ssh_host.server.directory / "authorized_keys").read_text()
    assert "rentune-run-" not in authorized, "the run's own key is removed when the run ends"
    assert not [k for k in memory_keyring.passwords if k[1].startswith("run-key/")], "and forgotten"
    for path in rentune_home.rglob("*"):
        assert not (path.is_file() and b"PRIVATE KEY" in path.read_bytes()), f"a private key was written to {path}"
    sshd_log = (ssh_host.server.directory / "sshd.log").read_text()
    run_key_logins = [line for line in sshd_log.splitlines() if "Accepted publickey" in line]
    assert len({line.split("ED25519 ")[-1] for line in run_key_logins}) == 2, "identity first, then the run key"
    history = [t["to_state"] for t in RunStore().transitions(runs[0]["id"])]
    assert history == [
        "planned",
        "connecting",
        "uploading",
        "bootstrapping",
        "training",
        "syncing",
        "pulling",
        "finished",
    ]


def test_cut_connections_repeat_nothing_and_a_killed_trainer_is_relaunched_and_resumes(
    ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path
) -> None:
    """Three faults in one run: every connection cut while the machine is set up (the reconnect follows the same
    bootstrap), the trainer killed at its first checkpoint (relaunched, it resumes from there), and every connection
    cut again as the relaunched trainer starts (no event lost or repeated across the reconnect)."""
    python, starts = python_wrapper(tmp_path, delay_s=3)
    runner = engine()
    record = runner.create(load(with_python(make_spec(ssh_host, max_steps=30), python)))
    folder = runner.folder(record.id)

    async def scenario() -> RunState:
        drive = asyncio.ensure_future(runner.drive(record.id))
        while not starts.exists():
            await asyncio.sleep(0.05)
        assert ssh_host.server.cut_connections() >= 1
        await wait_local_event(folder, lambda e: e["event"] == "checkpoint" and e["step"] >= 10)
        os.kill(int(RunStore().get(record.id).pid or 0), signal.SIGKILL)
        while RunStore().get(record.id).relaunches == 0:  # the new trainer needs seconds to start: cut meanwhile
            await asyncio.sleep(0.05)
        assert ssh_host.server.cut_connections() >= 1
        return (await drive).state

    assert asyncio.run(scenario()) is RunState.FINISHED, RunStore().get(record.id).error
    assert len(starts.read_text().splitlines()) == 1, "the reconnect followed the running bootstrap"
    history = [t["to_state"] for t in RunStore().transitions(record.id)]
    assert history.count("uploading") == 1 and history.count("bootstrapping") == 1
    assert RunStore().get(record.id).relaunches == 1
    events = assert_contiguous(folder)
    installing = [e.get("step") for e in events if e["event"] == "state" and e["state"] == "installing"]
    assert installing[:2] == ["environment", "check"] and sum(1 for e in events if e.get("ready") is True) == 1
    trainings = [i for i, e in enumerate(events) if e["event"] == "state" and e["state"] == "training"]
    resumed = int(events[trainings[-1]]["resume_from"].split("-")[1])
    assert resumed >= 10
    after = [e["step"] for e in events[trainings[-1] :] if e["event"] == "step"]
    assert after == list(range(resumed + 1, 31)), "across the cut: every step once"


def test_app_killed_before_saving_the_pid_then_resume_follows_the_same_trainer(
    ssh_host: SshHost, make_spec: SpecFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app dies mid-training, and its last moments lost the trainer's pid: resume finds the trainer by the run
    folder's pid file and follows it, never starting a second one. (With the pid saved: the wizard's "a new window
    reattaches" test.)"""
    spec = make_spec(ssh_host, max_steps=30)
    app = subprocess.Popen(
        [sys.executable, "-m", "desktop", "run", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert app.stdout is not None
    for line in app.stdout:
        if line.startswith("checkpoint at step"):
            break
    app.kill()
    app.wait()
    app.stdout.close()
    assert main(["runs", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)[0]
    assert run["state"] == "training"
    first = RunStore().get(run["id"]).pid
    RunStore().update(run["id"], pid=None)
    assert main(["resume", run["id"][:15]]) == 0
    out = capsys.readouterr().out
    assert f"a trainer is already running in the run's folder (pid {first}); following it" in out
    final = RunStore().get(run["id"])
    assert final.state is RunState.FINISHED and final.relaunches == 0 and final.pid == first
    events = assert_contiguous(RunStore().folder(run["id"]))
    assert len([e for e in events if e["event"] == "state" and e["state"] == "training"]) == 1, "one trainer"
    assert not any(line.startswith(("uploaded", "trainer started")) for line in out.splitlines()), "none started"


@pytest.mark.timeout(900)  # two uploads, two setups and 20 slow steps: ~30 s alone, 200 s beside busy loops
def test_machine_lost_then_resume_on_another_machine(
    ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = engine(grace_seconds=5)
    # grad_accum 8 makes a step ~8x longer, so pulls keep up with the checkpoint interval as on a real GPU.
    record = runner.create(load(make_spec(ssh_host, max_steps=20, grad_accum=8)))
    folder = runner.folder(record.id)

    async def lose_machine() -> RunState:
        drive = asyncio.ensure_future(runner.drive(record.id))
        await wait_local_event(folder, lambda e: e["event"] == "checkpoint" and e["step"] >= 10)
        deadline = time.monotonic() + 300  # a safety net: until that checkpoint is safe on this computer
        while time.monotonic() < deadline:
            if (folder / "checkpoints" / "checkpoint-10" / "rentune_checkpoint.json").exists():
                break
            await asyncio.sleep(0.05)
        remote = RunStore().get(record.id)
        os.kill(int(remote.pid or 0), signal.SIGKILL)
        await asyncio.to_thread(subprocess.run, ["rm", "-rf", str(remote.remote_dir)], check=True)
        return (await drive).state

    assert asyncio.run(lose_machine()) is RunState.PAUSED
    pulled = sorted(folder.glob("checkpoints/checkpoint-*"))
    safe = [p for p in pulled if (p / "rentune_checkpoint.json").exists()]
    assert safe, f"a complete checkpoint is on this computer (pulled: {[p.name for p in pulled]})"
    last_local = max(int(p.name.split("-")[1]) for p in safe)
    second = SshServer(tmp_path / "second-sshd")
    second.start()
    try:
        other = second.host()
        code = main(["resume", record.id, "--target", other.url, "--identity", str(other.client_key)])
        assert code == 0, capsys.readouterr().out
    finally:
        second.stop()
    events = assert_contiguous(folder)
    resumed = [e for e in events if e["event"] == "state" and e["state"] == "training"][-1]
    assert resumed["resume_from"] == f"checkpoint-{last_local}"
    steps_before = max(e["step"] for e in events[: events.index(resumed)] if e["event"] == "step")
    assert steps_before - last_local <= 10, "at most one checkpoint interval is lost"
    assert RunStore().get(record.id).state is RunState.FINISHED


def test_changed_host_key_is_refused(ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path) -> None:
    """The key pinned at the first contact is the one every later contact must offer (no training needed: a
    machine without the spec's Python fails, with the reason, right after the first contact pinned its key)."""
    runner = engine()
    spec = make_spec(ssh_host).read_text().replace(f'python = "{sys.executable}"', 'python = "/nonexistent/python3"')
    (tmp_path / "NOPYTHON.toml").write_text(spec)
    record = runner.create(load(tmp_path / "NOPYTHON.toml"))
    failed = asyncio.run(runner.drive(record.id))
    assert failed.state is RunState.FAILED, "a machine that cannot prepare fails the run instead of retrying"
    assert failed.error and "preparing the machine failed" in failed.error and "[target] python" in failed.error
    pinned = str(RunStore().get(record.id).host_key).split()[:2]
    assert pinned == ssh_host.host_public_key.split()[:2], "pinned at the first contact"
    impostor = SshServer(tmp_path / "impostor")
    impostor.port = ssh_host.port
    ssh_host.server.stop()
    impostor.start()
    try:
        store = RunStore()
        with store._db() as db:  # pretend the run is still live on that host
            db.execute("UPDATE runs SET state = 'training' WHERE id = ?", (record.id,))
        final = asyncio.run(runner.drive(record.id))
    finally:
        impostor.stop()
    assert final.state is RunState.FAILED
    assert final.error is not None and "host key" in final.error and "changed" in final.error


def test_detached_run_on_a_chatty_machine_finishes_and_status_and_logs_show_it(
    ssh_server: SshServer, make_spec: SpecFactory, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The machine's login shell prints a banner and a number before every command (as some clouds' images do):
    the engine still reads its answers and launches one trainer."""
    home = tmp_path / "chatty-home"
    home.mkdir()
    (home / ".bashrc").write_text('echo "Welcome to GPU Cloud! Your balance: 4242"\necho 4242\n')
    ssh_server.extra_config = [f"SetEnv HOME={home}"]  # bash started by sshd reads ~/.bashrc before every command
    ssh_server.restart()
    host = ssh_server.host()

    async def login_output() -> str:
        async with asyncssh.connect(**host.connect_kwargs()) as conn:  # type: ignore[arg-type]
            return str((await conn.run("true")).stdout)

    assert "Welcome to GPU Cloud" in asyncio.run(login_output()), "the machine is chatty"

    assert main(["run", str(make_spec(host, max_steps=10)), "--detach"]) == 0
    assert "started in the background" in capsys.readouterr().out
    store = RunStore()
    run_id = store.all()[0].id
    deadline = time.monotonic() + 600  # a safety net
    while time.monotonic() < deadline:
        if store.get(run_id).state in {RunState.FINISHED, RunState.FAILED, RunState.PAUSED}:
            break
        time.sleep(0.2)
    assert store.get(run_id).state is RunState.FINISHED
    assert main(["status", run_id]) == 0
    status = capsys.readouterr().out
    assert "finished" in status and "SHA256:" in status
    assert main(["logs", run_id]) == 0
    logs = capsys.readouterr().out
    assert "step 10: loss" in logs and "[done]" in logs
    assert main(["logs", run_id, "--payload"]) == 0
    assert "train_runtime" in capsys.readouterr().out, "the trainer's own log comes from the machine"
    pid_file = tmp_path / "remote" / run_id / "out" / "trainer.pid"
    assert pid_file.read_text().strip() == str(store.get(run_id).pid), "the pid read through the noise"


def test_stop_saves_a_checkpoint_brings_it_home_and_cancels(
    ssh_host: SshHost, make_spec: SpecFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_spec(ssh_host, max_steps=100_000, checkpoint_steps=0)
    driver = subprocess.Popen(
        [sys.executable, "-m", "desktop", "run", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert driver.stdout is not None
    for line in driver.stdout:
        if line.startswith("step 5:"):
            break
    run_id = RunStore().all()[0].id
    assert main(["stop", run_id]) == 0, "0 only once the run is cancelled"
    assert f"run {run_id}: cancelled" in capsys.readouterr().out
    driver.wait(timeout=120)
    driver.stdout.close()
    record = RunStore().get(run_id)
    assert record.state is RunState.CANCELLED
    local = list((RunStore().folder(run_id) / "checkpoints").glob("checkpoint-*/rentune_checkpoint.json"))
    assert local, "the checkpoint written on SIGTERM is on this computer"
