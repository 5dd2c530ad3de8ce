"""A rented machine is untrusted and fails in many ways: what it refuses stops the run at once with its own words,
what it sends is checked before it is used, and the run's key never stays on it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import signal
import time
from pathlib import Path

import asyncssh
import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.billing.meter import last_progress
from desktop.services.machines.ssh import fingerprint
from desktop.services.platform.secrets import SecretStore
from desktop.services.renting.manager import RunManager
from desktop.services.runs.engine import EngineOptions, RunError
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import InstalledKey, RunStore
from tests.fixtures.fake_machine import FakeHost
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory
from tests.runs.test_engine_end_to_end import assert_contiguous, engine, load, wait_local_event
from tests.runs.test_engine_logic import create_run, make_engine, trains_to_the_end
from trainer_payload.protocol import EVENTS_FILE_NAME, TS_RANGE, EventKind

pytestmark = pytest.mark.slow


def authorized(host: SshHost) -> str:
    return (host.server.directory / "authorized_keys").read_text()


def machine_events(tmp_path: Path, run_id: str) -> Path:
    """The event stream on the machine (the test sshd's work folder is on this computer)."""
    return tmp_path / "remote" / run_id / "out" / EVENTS_FILE_NAME


def kill(pid: int | None) -> None:
    """Ends a trainer the test left running (a run that failed or was cancelled while unreachable)."""
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def with_workdir(spec_path: Path, tmp_path: Path, workdir: Path) -> Path:
    text = spec_path.read_text().replace(f'workdir = "{tmp_path / "remote"}"', f'workdir = "{workdir}"')
    spec_path.write_text(text)
    return spec_path


# -- what the machine refuses stops the run at once --------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("below a file", "Not a directory"),
        ("in a system folder", "cannot create directory '/sys/rentune-test'"),
        ("under a folder that does not exist", "'/proc/rentune-test': No such file or directory"),
    ],
)
async def test_an_unusable_work_folder_fails_the_run_at_once_in_the_machines_words(
    ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path, where: str, said: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    workdir = {
        "below a file": blocker / "work",
        "in a system folder": Path("/sys/rentune-test"),
        "under a folder that does not exist": Path("/proc/rentune-test/runs"),  # nobody, root too, can create it
    }[where]
    runner = engine(grace_seconds=600)  # retrying would go on for ten minutes
    record = runner.create(load(with_workdir(make_spec(ssh_host), tmp_path, workdir)))
    started = time.monotonic()
    final = await asyncio.wait_for(runner.drive(record.id), 60)
    assert time.monotonic() - started < 60, "at once, far within the grace period"
    assert final.state is RunState.FAILED
    assert final.error is not None
    assert "cannot create directory" in final.error and said in final.error, "the machine's own message"
    assert "set [target] workdir to a folder the login can create and write" in final.error, "and the fix"
    assert "unreachable" not in final.error and "\n" not in final.error
    history = [t["to_state"] for t in RunStore().transitions(record.id)]
    assert history == ["planned", "connecting", "uploading", "failed"], "no reconnect loop"
    assert "rentune-run-" not in authorized(ssh_host), "the run's key comes off the machine when the run fails"
    assert RunStore().installed_keys() == []


@pytest.mark.parametrize("wrong", ["user", "key"])
async def test_a_refused_login_fails_at_once_naming_the_login_and_the_keys(
    ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path, wrong: str
) -> None:
    spec_path = make_spec(ssh_host)
    user, key = ssh_host.user, ssh_host.client_key
    if wrong == "user":
        user = "nobody-rents-this"
        spec_path.write_text(spec_path.read_text().replace(f"ssh://{ssh_host.user}@", f"ssh://{user}@"))
    else:
        key = tmp_path / "not_authorised_ed25519"
        asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
        spec_path.write_text(spec_path.read_text().replace(str(ssh_host.client_key), str(key)))
    runner = engine(grace_seconds=600)
    record = runner.create(load(spec_path))
    final = await asyncio.wait_for(runner.drive(record.id), 60)
    assert final.state is RunState.FAILED
    assert final.error is not None
    assert final.error.startswith(f"login as {user}@{ssh_host.host}:{ssh_host.port} refused for {key}; ")
    assert "authorized_keys" in final.error and "--identity" in final.error
    assert [t["to_state"] for t in RunStore().transitions(record.id)] == ["planned", "connecting", "failed"]


def test_a_run_whose_keys_were_all_revoked_names_its_own_key_and_the_identity(
    ssh_host: SshHost, make_spec: SpecFactory
) -> None:
    runner = engine()
    record = runner.create(load(make_spec(ssh_host)))
    store = RunStore()
    store.transition(record.id, RunState.CONNECTING)
    store.transition(record.id, RunState.PAUSED, "machine unreachable for 120 s")
    asyncio.run(runner.pull(record.id))  # the first contact installs the run's own key
    (ssh_host.server.directory / "authorized_keys").write_text("")  # the machine's owner revoked every key
    with pytest.raises(RunError) as refused:
        asyncio.run(runner.pull(record.id))
    run_key = f"the run key (ed25519 {fingerprint(record.spec['run_key_public'])})"
    where = f"{ssh_host.user}@{ssh_host.host}:{ssh_host.port}"
    assert str(refused.value).startswith(f"login as {where} refused for {run_key} and {ssh_host.client_key}; ")
    assert store.get(record.id).state is RunState.PAUSED


# -- what the machine sends is checked before it is used ----------------------------------------------------------


async def test_a_checkpoint_naming_files_outside_the_run_folder_fails_the_run_and_writes_nothing(
    ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path, rentune_home: Path
) -> None:
    runner = engine(grace_seconds=600)
    record = runner.create(load(make_spec(ssh_host)))
    # The machine's event stream starts with a checkpoint whose files climb out of the run folder with "..";
    # the file it names exists there, so following the names would copy it out.
    out = tmp_path / "remote" / record.id / "out"
    (out / "checkpoint-7").mkdir(parents=True)
    secret = tmp_path / "machine-secret"
    secret.write_text("the machine chose this content")
    hostile = {
        "ts": time.time(),
        "seq": 1,
        "event": "checkpoint",
        "step": 7,
        "path": "checkpoint-7",
        "bytes": secret.stat().st_size,
        "sha256": {"../../../../machine-secret": hashlib.sha256(secret.read_bytes()).hexdigest()},
    }
    (out / EVENTS_FILE_NAME).write_text(json.dumps(hostile) + "\n")
    final = await asyncio.wait_for(runner.drive(record.id), 240)
    kill(final.pid)
    assert final.state is RunState.FAILED
    assert final.error == "the machine sent an unsafe path: '../../../../machine-secret' (it climbs out with '..')"
    escaped = await asyncio.to_thread(lambda: list(rentune_home.rglob("machine-secret*")))
    assert not escaped, "nothing was written outside the run folder"
    assert "rentune-run-" not in authorized(ssh_host)


async def test_a_link_on_this_computer_leading_out_of_the_run_folder_is_not_followed(tmp_path: Path) -> None:
    host, lines = FakeHost(), list[str]()
    runner = make_engine(host, lines)
    record = create_run(runner, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (runner.folder(record.id) / "checkpoints").symlink_to(outside)
    host.on_launch = trains_to_the_end
    final = await asyncio.wait_for(runner.drive(record.id), 30)
    assert final.state is RunState.FAILED
    assert final.error is not None and final.error.startswith("the machine sent an unsafe path: 'checkpoints'")
    assert "through a link" in final.error
    assert list(outside.iterdir()) == [], "no checkpoint went through the link"


async def test_a_garbage_line_in_the_event_stream_is_skipped_and_the_run_goes_on(tmp_path: Path) -> None:
    host, lines = FakeHost(), list[str]()
    runner = make_engine(host, lines)
    record = create_run(runner, tmp_path)

    def trains_among_garbage(fake: FakeHost, folder: str) -> None:
        fake.emit(EventKind.STEP, step=1, loss=2.0)
        fake.write_raw("this is not an event")
        fake.write_raw('{"seq": 99999999, "event": "step"}')
        fake.emit(EventKind.STEP, step=2, loss=1.5)
        trains_to_the_end(fake, folder)

    host.on_launch = trains_among_garbage
    final = await asyncio.wait_for(runner.drive(record.id), 30)
    assert final.state is RunState.FINISHED, final.error
    events = assert_contiguous(runner.folder(record.id))
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    assert any(line.startswith("skipped 2 malformed event line(s) from the machine") for line in lines), lines


@pytest.mark.parametrize("ts", [math.nan, math.inf, 1e300], ids=["NaN", "Infinity", "1e300"])
async def test_an_event_with_an_impossible_time_is_skipped_and_the_idle_guard_still_counts(
    tmp_path: Path, ts: float
) -> None:
    host, lines = FakeHost(), list[str]()
    runner = make_engine(host, lines, EngineOptions(poll_seconds=0.02, grace_seconds=0.5))
    record = create_run(runner, tmp_path)
    folder = runner.folder(record.id)

    def trains_then_lies_about_the_time(fake: FakeHost, _folder: str) -> None:
        fake.emit(EventKind.STEP, step=1, loss=2.0)
        fake.emit(EventKind.STEP, step=2, loss=1.5)
        fake.events[-1]["ts"] = ts  # the machine writes NaN, Infinity or 1e+300

    host.on_launch = trains_then_lies_about_the_time
    drive = asyncio.ensure_future(runner.drive(record.id))
    try:
        for _ in range(1000):
            mirrored = mirrored_events(folder)
            if any(line.startswith("step 1:") for line in lines) and mirrored and mirrored[-1].get("step") == 1:
                break
            await asyncio.sleep(0.02)
    finally:
        drive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drive
    skipped = next(line for line in lines if line.startswith("skipped 1 malformed event line(s) from the machine"))
    assert "must be seconds since 1970" in skipped
    events = mirrored_events(folder)
    assert [e.get("step") for e in events if e["event"] == "step"] == [1], "the line with the impossible time is gone"
    assert all(TS_RANGE[0] <= e["ts"] <= TS_RANGE[1] for e in events)
    # What the rental driver's idle guard measures from: a real moment in the past, so the guard goes on counting.
    moved = last_progress(RunStore().get(record.id), RunStore().transitions(record.id), folder)
    assert math.isfinite(moved) and moved <= time.time()


async def test_a_self_stop_the_machine_will_not_start_is_reported_and_training_goes_on(tmp_path: Path) -> None:
    host, lines = FakeHost(), list[str]()
    runner = make_engine(host, lines)
    record = create_run(runner, tmp_path)
    runner.ctx.set_spec(record.id, self_stop={"provider": "vast", "api_url": "https://x", "minutes": 5})
    host.refuse("trainer_payload.self_stop", "python3: No module named trainer_payload")
    host.on_launch = trains_to_the_end
    final = await asyncio.wait_for(runner.drive(record.id), 30)
    assert final.state is RunState.FINISHED, final.error
    said = "the self-stop could not be started (python3: No module named trainer_payload; exit status 1)"
    assert any(line.startswith(said) for line in lines), lines
    assert not any(line.startswith("self-stop armed") for line in lines)


# -- launching exactly one trainer -------------------------------------------------------------------------------


class Crash(BaseException):
    """The app dies right here."""


def test_a_crash_between_mirroring_events_and_saving_the_offset_repeats_no_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, lines = FakeHost(), list[str]()
    record = create_run(make_engine(host, lines), tmp_path)

    def eight_steps(fake: FakeHost, folder: str) -> None:
        for step in range(1, 9):
            fake.emit(EventKind.STEP, step=step, loss=1.0)
        trains_to_the_end(fake, folder)

    host.on_launch = eight_steps
    save = RunStore.update

    def crash_before_saving_the_offset(self: RunStore, run_id: str, **fields: object) -> object:
        if "events_offset" in fields and int(str(fields.get("last_seq", 0))) >= 5:
            raise Crash
        return save(self, run_id, **fields)

    with monkeypatch.context() as patch:
        patch.setattr(RunStore, "update", crash_before_saving_the_offset)
        with pytest.raises(Crash):
            asyncio.run(make_engine(host, lines).drive(record.id))
    assert RunStore().get(record.id).last_seq < 5, "the offset was not saved"
    assert asyncio.run(make_engine(host, lines).drive(record.id)).state is RunState.FINISHED
    assert host.launches == 1, "the trainer that was running is followed again, not started anew"
    events = assert_contiguous(RunStore().folder(record.id))
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 9))


# -- looking at a paused run leaves it paused --------------------------------------------------------------------


def test_pull_and_the_payload_log_leave_a_paused_run_paused(
    ssh_host: SshHost, make_spec: SpecFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = engine()
    record = runner.create(load(make_spec(ssh_host)))
    store = RunStore()
    store.transition(record.id, RunState.CONNECTING)
    store.transition(record.id, RunState.PAUSED, "machine unreachable for 120 s")
    before = store.transitions(record.id)
    assert main(["pull", record.id]) == 0
    assert "no checkpoint written yet" in capsys.readouterr().out
    assert main(["logs", record.id, "--payload"]) == 0
    assert store.get(record.id).state is RunState.PAUSED, "only driving a run changes its state"
    assert store.transitions(record.id) == before


# -- the run's key never stays on the machine --------------------------------------------------------------------


async def test_stop_before_the_trainer_starts_takes_the_key_off_the_machine(
    ssh_host: SshHost, make_spec: SpecFactory
) -> None:
    manager = RunManager(RunStore(), SecretStore())
    # a job too long to end on its own: on a loaded machine the stop may land only after the trainer started
    record = manager.launch(load(make_spec(ssh_host, max_steps=100_000, checkpoint_steps=0)))
    for _ in range(600):
        if RunStore().installed_keys(run_id=record.id):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # the install command has run (the key is recorded just before it)
    stopped = await asyncio.wait_for(manager.stop(record.id), 120)  # waits out the upload: long on a loaded machine
    assert stopped.state is RunState.CANCELLED and stopped.pid is None
    assert "rentune-run-" not in authorized(ssh_host)
    assert RunStore().installed_keys() == []


def test_a_key_that_could_not_be_removed_is_listed_and_removed_at_the_next_contact(
    ssh_host: SshHost, make_spec: SpecFactory, capsys: pytest.CaptureFixture[str], memory_keyring: MemoryKeyring
) -> None:
    runner = engine(grace_seconds=1)
    record = runner.create(load(make_spec(ssh_host, max_steps=100_000, checkpoint_steps=0)))
    folder = runner.folder(record.id)
    trainer: int | None = None

    async def lose_the_machine() -> RunState:
        drive = asyncio.ensure_future(runner.drive(record.id))
        await wait_local_event(folder, lambda e: e["event"] == "step", limit_s=200)
        ssh_host.server.stop()
        return (await drive).state

    try:
        assert asyncio.run(lose_the_machine()) is RunState.PAUSED
        trainer = RunStore().get(record.id).pid
        assert asyncio.run(runner.stop(record.id)).state is RunState.CANCELLED
        assert main(["doctor"]) == 0
        listed = capsys.readouterr().out
        assert f"run {record.id} on {ssh_host.url} since " in listed and "(the run has ended)" in listed
        runner.delete(record.id)  # the record goes; the key stays remembered
        assert [k.run_id for k in RunStore().installed_keys()] == [record.id]
        ssh_host.server.start()
        assert main(["doctor"]) == 0
        assert record.id not in capsys.readouterr().out
    finally:
        kill(trainer)
    assert "rentune-run-" not in authorized(ssh_host)
    assert RunStore().installed_keys() == []
    assert not [k for k in memory_keyring.passwords if k[1].startswith("run-key/")], "and its private half is gone"


def test_a_later_contact_with_the_machine_removes_keys_left_by_ended_runs(
    ssh_host: SshHost, make_spec: SpecFactory
) -> None:
    left = asyncssh.generate_private_key("ssh-ed25519", comment="rentune-run-gone").export_public_key()
    line = left.decode().strip()
    keys_file = ssh_host.server.directory / "authorized_keys"
    keys_file.write_text(keys_file.read_text() + line + "\n")
    store = RunStore()
    store.remember_key(InstalledKey("gone", ssh_host.url, line, str(keys_file), None, None, time.time() - 3600))
    runner = engine()
    record = runner.create(load(make_spec(ssh_host)))
    store.transition(record.id, RunState.CONNECTING)
    store.transition(record.id, RunState.PAUSED, "machine unreachable for 120 s")
    assert asyncio.run(runner.pull(record.id)) is None  # any contact with that machine
    assert line not in keys_file.read_text()
    assert [k.run_id for k in store.installed_keys()] == [record.id], "the live run's own key stays"
