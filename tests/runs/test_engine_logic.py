"""The run engine's decisions, driven through an in-memory machine (no sshd, no training).

Each test gives the engine a :class:`~tests.fixtures.fake_machine.FakeHost` as its ``connect`` and checks what the
user sees: the run's final state, its error in the machine's words, and what was or was not written at home.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.spec import RunSpec, SshTarget
from desktop.core.runs.states import RunState
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.store import RunRecord, RunStore
from desktop.services.runs.transfer import SMALL_FILE_BYTES, UPLOAD_ARCHIVE_NAME, payload_files
from tests.fixtures.fake_machine import FakeHost
from trainer_payload.protocol import CHECKPOINT_MARKER, EventKind, JobState

FAST = EngineOptions(poll_seconds=0.02, grace_seconds=0.5)


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


def make_engine(host: FakeHost, lines: list[str], options: EngineOptions = FAST) -> RunEngine:
    return RunEngine(RunStore(), SecretStore(), options, report=lines.append, connect=host.connect)


def create_run(engine: RunEngine, tmp_path: Path, hourly_rate_usd: float = 0.0, budget_usd: float = 0.0) -> RunRecord:
    train = tmp_path / "train.jsonl"
    train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    target = SshTarget("trainer", "gpu.example", 22)
    return engine.create(RunSpec("org/tiny-model", train, None, {"max_steps": 4}, target, budget_usd, hourly_rate_usd))


def trains_to_the_end(host: FakeHost, folder: str) -> None:
    """A trainer that writes one checkpoint and its adapter, then says it is done."""
    digests = host.write_folder(f"{folder}/out/checkpoints/checkpoint-2", {"adapter.safetensors": b"step 2"})
    host.emit(EventKind.CHECKPOINT, step=2, path="checkpoints/checkpoint-2", bytes=6, sha256=digests)
    files = host.write_folder(f"{folder}/out/adapter", {"adapter_model.safetensors": b"final weights"})
    host.emit(EventKind.DONE, adapter_path="adapter", files=files)


async def until_trained_by_a_trainer(engine: RunEngine, run_id: str) -> None:
    while engine.store.get(run_id).pid is None:
        await asyncio.sleep(0.01)


async def test_a_connection_lost_while_launching_follows_the_trainer_that_started(
    host: FakeHost, tmp_path: Path
) -> None:
    lines: list[str] = []
    engine = make_engine(host, lines)
    record = create_run(engine, tmp_path)
    host.on_launch = trains_to_the_end
    host.drop_after("-m trainer_payload run")  # the trainer starts; its pid never reaches this computer

    final = await asyncio.wait_for(engine.drive(record.id), 30)

    assert final.state is RunState.FINISHED, final.error
    assert host.launches == 1 and final.relaunches == 0, "followed by its pid file, not started again"
    assert any("a trainer is already running in the run's folder" in line for line in lines)


async def test_dropped_connections_are_retried_and_the_run_still_finishes(host: FakeHost, tmp_path: Path) -> None:
    lines: list[str] = []
    engine = make_engine(host, lines)
    record = create_run(engine, tmp_path)
    host.on_launch = trains_to_the_end
    host.connect_failures = [ConnectionResetError("reset by peer"), TimeoutError()]

    final = await asyncio.wait_for(engine.drive(record.id), 30)

    assert final.state is RunState.FINISHED, final.error
    assert sum("cannot reach the machine" in line for line in lines) == 2
    adapter = engine.folder(record.id) / "adapter"
    assert (adapter / "adapter_model.safetensors").read_bytes() == b"final weights"
    assert (engine.folder(record.id) / "checkpoints" / "checkpoint-2" / CHECKPOINT_MARKER).is_file()
    assert host.launches == 1, "a reconnect never starts a second trainer"


async def test_a_machine_that_stays_unreachable_pauses_the_run_instead_of_failing_it(
    host: FakeHost, tmp_path: Path
) -> None:
    engine = make_engine(host, [])
    record = create_run(engine, tmp_path)
    host.connect_failures = [ConnectionResetError("reset by peer")] * 1000

    final = await asyncio.wait_for(engine.drive(record.id), 30)

    assert final.state is RunState.PAUSED
    assert final.error and "machine unreachable" in final.error
    assert host.connects > 1, "it kept trying within the grace period"


async def test_a_full_disk_fails_the_run_at_once_in_the_machines_words(host: FakeHost, tmp_path: Path) -> None:
    engine = make_engine(host, [])
    record = create_run(engine, tmp_path)
    host.refuse(".rentune-write-test", "cannot create .rentune-write-test: No space left on device")

    final = await asyncio.wait_for(engine.drive(record.id), 30)

    assert final.state is RunState.FAILED
    assert final.error and "No space left on device" in final.error and "free space" in final.error
    assert host.connects == 2, "no retry: one login, then one with the run's own key"
    assert host.launches == 0 and not any(name.endswith("train.jsonl") for name in host.files)


@pytest.mark.parametrize(
    ("path", "files"),
    [("../../../outside", {"weights": "0" * 64}), ("checkpoints/checkpoint-2", {"../../../outside": "0" * 64})],
    ids=["checkpoint path", "file name"],
)
async def test_a_checkpoint_naming_a_path_outside_the_run_fails_the_run_and_writes_nothing(
    host: FakeHost, tmp_path: Path, path: str, files: dict[str, str]
) -> None:
    engine = make_engine(host, [])
    record = create_run(engine, tmp_path)
    host.on_launch = lambda fake, _folder: fake.emit(EventKind.CHECKPOINT, step=2, path=path, bytes=1, sha256=files)

    final = await asyncio.wait_for(engine.drive(record.id), 30)

    assert final.state is RunState.FAILED
    assert final.error and "unsafe path" in final.error
    assert host.downloads == []
    assert not (engine.folder(record.id) / "checkpoints").exists()
    assert not await asyncio.to_thread(lambda: list(tmp_path.rglob("outside")))


async def test_a_user_stop_ends_the_run_as_cancelled_not_failed(host: FakeHost, tmp_path: Path) -> None:
    engine = make_engine(host, [])
    record = create_run(engine, tmp_path)
    driving = asyncio.ensure_future(engine.drive(record.id))
    await asyncio.wait_for(until_trained_by_a_trainer(engine, record.id), 10)

    await engine.stop(record.id)  # another part of the app stops it while this engine follows the run
    final = await asyncio.wait_for(driving, 30)

    assert final.state is RunState.CANCELLED
    assert not final.error
    assert host.launches == 1, "a trainer stopped on request is not relaunched"
    assert any(e["state"] == JobState.FAILED for e in host.events if e["event"] == EventKind.STATE)


async def test_a_run_over_its_budget_is_stopped_and_says_why(host: FakeHost, tmp_path: Path) -> None:
    engine = make_engine(host, [])
    record = create_run(engine, tmp_path, hourly_rate_usd=3600.0, budget_usd=0.2)  # $1 a second

    final = await asyncio.wait_for(engine.drive(record.id), 30)

    assert final.state is RunState.CANCELLED
    assert final.error and final.error.startswith("budget of $0.20 reached")
    assert "no checkpoint had been written" in final.error
    assert any(command.startswith(f"kill -TERM {final.pid}") for command in host.commands)


async def test_small_files_travel_as_one_archive_and_large_ones_on_their_own(host: FakeHost, tmp_path: Path) -> None:
    engine = make_engine(host, [])
    record = create_run(engine, tmp_path)
    big = '{"messages": [{"role": "user", "content": "' + "x" * (SMALL_FILE_BYTES + 1) + '"}]}\n'
    (tmp_path / "train.jsonl").write_text(big)
    host.on_launch = trains_to_the_end

    final = await asyncio.wait_for(engine.drive(record.id), 30)

    assert final.state is RunState.FINISHED
    folder = str(final.remote_dir)
    uploads = [c for c in host.commands if "tar -xf" in c]
    assert len(uploads) == 1, "one unpack for every small file"
    assert f"{folder}/{UPLOAD_ARCHIVE_NAME}" not in host.files, "the archive is deleted once unpacked"
    assert not (engine.folder(record.id) / UPLOAD_ARCHIVE_NAME).exists()
    assert host.received[f"{folder}/data/train.jsonl"] == big.encode(), "the large file travelled on its own"
    assert f"{folder}/data/train.jsonl" not in host.files, "and was deleted with the data at the end"
    sent = {
        f"payload/trainer_payload/{p.name}": await asyncio.to_thread(Path(str(p)).read_bytes) for p in payload_files()
    }
    assert all(host.files[f"{folder}/{name}"] == data for name, data in sent.items())
    assert b'"max_steps": 4' in host.files[f"{folder}/job.json"]


async def test_an_app_closed_while_the_adapter_comes_home_finishes_on_reattach_without_retraining(
    host: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(host, [])
    record = create_run(engine, tmp_path)
    host.on_launch = trains_to_the_end

    async def closed_mid_download(self: RunEngine, run_id: str, machine: Any, event: dict[str, Any]) -> None:
        raise asyncio.CancelledError  # the app quits while the adapter is being pulled

    with monkeypatch.context() as patch:
        patch.setattr(RunEngine, "_finish", closed_mid_download)
        with contextlib.suppress(asyncio.CancelledError):
            await engine.drive(record.id)
    assert engine.store.get(record.id).state is not RunState.FINISHED
    host.trainer_pid = None  # the trainer that had finished has exited

    final = await asyncio.wait_for(make_engine(host, []).drive(record.id), 30)

    assert final.state is RunState.FINISHED and final.adapter
    assert final.relaunches == 0 and host.launches == 1, "the trainer that had finished was not started again"
    assert (engine.folder(record.id) / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(
    ("rows", "objective", "problem"),
    [
        ('{"messages": [{"role": "user", "content": "hi"}]}', "dpo", 'objective "dpo" trains on preference pairs'),
        ('{"prompt": "Q?", "chosen": "yes", "rejected": "no"}', "sft", 'set [training] objective = "dpo"'),
        ('{"text": "Raw text to continue pre-training on."}', "sft", 'set [training] objective = "cpt"'),
        ('{"prompt": "Q?", "chosen": "yes", "rejected": "no"}', "cpt", 'objective "cpt" trains on raw text'),
    ],
)
def test_data_the_objective_cannot_train_on_is_refused_before_anything_is_recorded_or_rented(
    host: FakeHost, tmp_path: Path, rows: str, objective: str, problem: str
) -> None:
    from desktop.services.runs.errors import RunError

    engine = make_engine(host, [])
    train = tmp_path / "train.jsonl"
    train.write_text(rows + "\n")
    spec = RunSpec("org/tiny", train, None, {"objective": objective}, SshTarget("trainer", "gpu.example", 22), 0, 0)
    with pytest.raises(RunError, match=re.escape(problem)):
        engine.create(spec)
    assert engine.store.all() == [] and host.commands == []
    for fits, fitting in (("dpo", '{"prompt": "Q?", "chosen": "y", "rejected": "n"}'), ("orpo", None)):
        if fitting:
            train.write_text(fitting + "\n")
        assert engine.create(RunSpec("org/tiny", train, None, {"objective": fits}, spec.target, 0, 0)).id


async def test_the_wandb_key_goes_on_stdin_to_the_trainer_alone_and_its_absence_is_refused_before_renting(
    host: FakeHost, tmp_path: Path
) -> None:
    from desktop.services.platform.secrets import SecretName
    from desktop.services.runs.errors import RunError

    engine = make_engine(host, [])
    train = tmp_path / "train.jsonl"
    train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    training = {"max_steps": 4, "report_to": ["tensorboard", "wandb"]}
    spec = RunSpec("org/tiny-model", train, None, training, SshTarget("trainer", "gpu.example", 22), 0, 0)
    with pytest.raises(RunError, match=re.escape("the run reports to W&B ([tracking] report_to) but no Weights")):
        engine.create(spec)
    assert engine.store.all() == [] and host.commands == [], "refused before anything is recorded or contacted"
    key = "local-" + "5" * 48
    SecretStore().set(SecretName.WANDB, key)
    record = engine.create(spec)
    host.on_launch = trains_to_the_end
    final = await asyncio.wait_for(engine.drive(record.id), 30)
    assert final.state is RunState.FINISHED, final.error
    sent = [stdin for stdin in host.stdins if key in stdin]
    assert sent == [f"\n{key}\n"], "once, to the trainer's launch, as the line after the (absent) Hub token"
    assert not any(key in command for command in host.commands)


async def test_a_bucket_that_cannot_be_reached_sends_the_data_over_ssh_and_says_why(
    host: FakeHost, tmp_path: Path
) -> None:
    import socket

    from desktop.core.settings import Settings
    from desktop.core.storage import StorageSettings
    from desktop.services.platform.secrets import SecretName
    from desktop.services.platform.settings import save_settings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    save_settings(Settings(storage=StorageSettings(url="s3://data-bucket/x", endpoint=f"http://127.0.0.1:{closed}")))
    SecretStore().set(SecretName.BUCKET_KEY_ID, "AKIAEXAMPLE")
    SecretStore().set(SecretName.BUCKET_SECRET, "secret-example-value")
    lines: list[str] = []
    engine = make_engine(host, lines)
    record = create_run(engine, tmp_path)
    assert record.spec["bucket"]["url"] == "s3://data-bucket/x", "the run keeps the bucket it was created with"
    host.on_launch = trains_to_the_end
    final = await asyncio.wait_for(engine.drive(record.id), 60)
    assert final.state is RunState.FINISHED, final.error
    (said,) = [line for line in lines if "the data goes over SSH instead" in line]
    assert said.startswith(f"the bucket cannot be used (cannot reach http://127.0.0.1:{closed}")
    unpacks = [command for command in host.commands if "tar -xf" in command]
    assert len(unpacks) == 2, "the payload first, then the data the bucket could not carry, over SSH"
    assert not any("trainer_payload fetch" in command for command in host.commands), "no machine download tried"
