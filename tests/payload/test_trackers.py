"""The payload's trackers: trackio's database sealed inside every checkpoint and the adapter, put back on a resume
elsewhere; W&B (a fake W&B server, the real wandb client) gets every step with the key held in memory only, and a run
whose W&B key is missing or refused trains on; each tracker's own lock installed only for a job reporting to it."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fakes.wandb_server import FakeWandb
from tests.payload.conftest import JobFactory, events_of, payload_env, run_payload
from trainer_payload.checkpoints import is_complete
from trainer_payload.lock import LOCK, job_entries, read_lock, tracker_lock
from trainer_payload.protocol import CHECKPOINT_MARKER, TRACKERS, TRACKIO_DIR_NAME
from trainer_payload.trackers import copy_tracker_logs, restore_tracker_logs


def logged_losses(database: Path) -> dict[int, float]:
    """train/loss by training step in a trackio project database (read with SQLite alone, as a copy of the machine's).

    trackio numbers its rows itself; transformers logs the trainer's step beside each as ``train/global_step``.
    """
    with sqlite3.connect(database) as db:
        rows = [json.loads(metrics) for (metrics,) in db.execute("SELECT metrics FROM metrics")]
    return {row["train/global_step"]: row["train/loss"] for row in rows if "train/loss" in row}


def test_trackio_logs_every_step_into_a_database_sealed_inside_each_checkpoint_and_the_adapter(
    make_job: JobFactory,
) -> None:
    job = make_job(max_steps=20, report_to=["trackio"], tracking_project="support-bot", run_name="20261207-1-ab12")
    result = run_payload(job)
    assert result.returncode == 0, result.stderr[-2000:]
    out = job.parent / "out"
    steps = {e["step"]: e["loss"] for e in events_of(job) if e["event"] == "step"}
    for folder in [out / "checkpoints" / "checkpoint-10", out / "adapter"]:
        database = folder / TRACKIO_DIR_NAME / "support-bot.db"
        assert is_complete(folder) and database.is_file(), folder
        seal = json.loads((folder / CHECKPOINT_MARKER).read_text())
        assert f"{TRACKIO_DIR_NAME}/support-bot.db" in seal["files"], "the copy comes home verified"
    losses = logged_losses(out / "adapter" / TRACKIO_DIR_NAME / "support-bot.db")
    assert sorted(losses) == sorted(steps) and all(abs(losses[s] - steps[s]) < 1e-4 for s in steps)
    assert max(logged_losses(out / "checkpoints" / "checkpoint-10" / TRACKIO_DIR_NAME / "support-bot.db")) <= 10
    with sqlite3.connect(out / "adapter" / TRACKIO_DIR_NAME / "support-bot.db") as db:
        assert db.execute("SELECT DISTINCT run_name FROM metrics").fetchall() == [("20261207-1-ab12",)]


def test_a_run_reporting_to_wandb_without_its_key_trains_on_and_says_why_wandb_has_no_curves(
    make_job: JobFactory,
) -> None:
    job = make_job(max_steps=4, checkpoint_steps=0, report_to=["wandb"], wandb_url="http://127.0.0.1:9")
    result = run_payload(job)
    assert result.returncode == 0, result.stderr[-2000:]
    (training,) = [e for e in events_of(job) if e["event"] == "state" and e["state"] == "training"]
    assert training["tracking"].startswith("W&B has no API key on this machine")
    assert "training goes on without it" in training["tracking"]
    assert events_of(job)[-1]["state"] == "done"


def run_payload_with_wandb_key(job: Path, key: str, home: Path) -> tuple[int, str, set[str]]:
    """The payload as the launch shell starts it for a W&B run: the key read from stdin, exported to it alone.

    Returns its exit code, its output's tail, and the command lines of its children (wandb's service among them) that
    held the key in their environment at any moment while it ran.
    """
    env = payload_env() | {"HOME": str(home), "WANDB_API_KEY": key}
    command = [sys.executable, "-m", "trainer_payload", "run", str(job)]
    leaks: set[str] = set()
    with tempfile.TemporaryFile() as log:
        with subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env) as trainer:
            while trainer.poll() is None:
                leaks.update(name for name, environ in children_environments(trainer.pid) if key in environ)
                time.sleep(0.2)
        log.seek(0)
        return trainer.returncode, log.read().decode(errors="replace")[-3000:], leaks


def children_environments(pid: int) -> list[tuple[str, str]]:
    """(command, environment) of every descendant of ``pid`` now (those that end meanwhile are skipped)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            status = (proc / "status").read_text()
            parents = [line.split()[1] for line in status.splitlines() if line.startswith("PPid:")]
            if parents and int(parents[0]) == pid:
                found.append(
                    (
                        (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"),
                        (proc / "environ").read_bytes().decode(errors="replace"),
                    )
                )
                found += children_environments(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def test_a_run_reporting_to_wandb_streams_every_step_with_the_key_in_memory_only(
    make_job: JobFactory, tmp_path: Path
) -> None:
    fake = FakeWandb().start()
    try:
        job = make_job(max_steps=8, report_to=["wandb"], wandb_url=fake.url, run_name="20261207-1-ab12")
        code, output, leaks = run_payload_with_wandb_key(job, fake.api_key, tmp_path / "home")
    finally:
        fake.stop()
    assert code == 0, output
    assert not leaks, f"a child of the trainer had the key in its environment: {leaks}"
    steps = {e["step"]: e["loss"] for e in events_of(job) if e["event"] == "step"}
    run = fake.runs["20261207-1-ab12"]
    assert run.project == "rentune" and run.display_name == "20261207-1-ab12"
    streamed = {row["train/global_step"]: row["train/loss"] for row in run.history if "train/loss" in row}
    assert sorted(streamed) == sorted(steps) and all(abs(streamed[s] - steps[s]) < 1e-4 for s in steps)
    assert run.complete and run.exit_code == 0 and fake.auth_failures == 0 and not fake.unknown_operations
    for root in (job.parent, tmp_path / "home"):
        for path in root.rglob("*"):
            assert not (path.is_file() and fake.api_key.encode() in path.read_bytes()), f"the key is in {path}"
    assert not (tmp_path / "home" / ".netrc").exists()


def test_a_wandb_that_refuses_the_key_costs_the_run_its_curves_not_its_training(
    make_job: JobFactory, tmp_path: Path
) -> None:
    fake = FakeWandb().start()
    try:
        job = make_job(max_steps=4, checkpoint_steps=0, report_to=["wandb"], wandb_url=fake.url)
        code, output, _leaks = run_payload_with_wandb_key(job, "local-" + "f" * 48, tmp_path / "home")
    finally:
        fake.stop()
    assert code == 0, output
    (training,) = [e for e in events_of(job) if e["event"] == "state" and e["state"] == "training"]
    assert training["tracking"].startswith("W&B could not start the run (CommError")
    assert fake.auth_failures > 0 and not fake.runs and events_of(job)[-1]["state"] == "done"


def test_tracker_logs_are_copied_consistently_and_put_back_only_where_the_machine_has_none(tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "out" / "checkpoints" / "checkpoint-10"
    (out / TRACKIO_DIR_NAME).mkdir(parents=True)
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events.out.tfevents.1").write_bytes(b"curve")
    with sqlite3.connect(out / TRACKIO_DIR_NAME / "rentune.db") as db:
        db.execute("PRAGMA journal_mode=WAL")  # trackio's writer may hold rows in the write-ahead log
        db.execute("CREATE TABLE metrics (step INTEGER, metrics TEXT)")
        db.execute("""INSERT INTO metrics VALUES (9, '{"train/loss": 1.5, "train/global_step": 10}')""")
        db.commit()
        checkpoint.mkdir(parents=True)
        copy_tracker_logs(out, checkpoint)
    assert logged_losses(checkpoint / TRACKIO_DIR_NAME / "rentune.db") == {10: 1.5}
    assert (checkpoint / "tensorboard" / "events.out.tfevents.1").read_bytes() == b"curve"
    elsewhere = tmp_path / "new-machine" / "out"
    shutil.copytree(checkpoint, elsewhere / "checkpoints" / "checkpoint-10")  # what the app uploads on a resume
    restore_tracker_logs(elsewhere / "checkpoints" / "checkpoint-10", elsewhere)
    assert logged_losses(elsewhere / TRACKIO_DIR_NAME / "rentune.db") == {10: 1.5}
    (out / "tensorboard" / "events.out.tfevents.2").write_bytes(b"newer")
    restore_tracker_logs(checkpoint, out)  # the machine's own logs are newer than any checkpoint's: kept
    assert (out / "tensorboard" / "events.out.tfevents.2").is_file()


def test_each_tracker_has_a_hashed_lock_installed_only_for_a_job_reporting_to_it() -> None:
    main = {entry.name for entry in read_lock(LOCK)}
    for tracker, package in [("trackio", "trackio"), ("wandb", "wandb")]:
        entries = read_lock(tracker_lock(LOCK, tracker))
        assert package in {entry.name for entry in entries}
        assert all("--hash=sha256:" in entry.entry for entry in entries), tracker
        assert package not in main, "a run that does not report to it never installs it"
    assert job_entries(LOCK, []) == read_lock(LOCK)
    assert job_entries(LOCK, ["tensorboard"]) == read_lock(LOCK), "tensorboardX is in the payload's own lock"
    both = job_entries(LOCK, ["trackio", "wandb"])
    names = [entry.name for entry in both]
    assert {"trackio", "wandb"} <= set(names) and len(names) == len(set(names)), "a shared package once"
    shared = {e.name: e for e in read_lock(LOCK)}
    assert all(shared[e.name] == e for e in both if e.name in shared), "the payload's own lock wins"
    assert set(TRACKERS) == {"tensorboard", "trackio", "wandb"}
