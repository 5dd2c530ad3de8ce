"""A run the user stopped is resumed from its checkpoint: the engine reopens it and the trainer goes on.

Driven through the in-memory machine (:class:`~tests.fixtures.fake_machine.FakeHost`); the real loopback machine
and the tiny model do the same in ``tests/ui/test_monitor_page.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.core.runs.spec import RunSpec, SshTarget
from desktop.core.runs.states import RunState, TransitionError, check_transition
from desktop.services.machines.keys import load_run_key
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.actions import resume_refusal
from desktop.services.runs.engine import EngineOptions, RunEngine, RunError
from desktop.services.runs.store import RunStore
from tests.fixtures.fake_machine import FakeHost
from trainer_payload.protocol import EventKind, JobState

FAST = EngineOptions(poll_seconds=0.02, grace_seconds=0.5)


def checkpoint_then_wait(host: FakeHost, folder: str) -> None:
    """A trainer that seals a checkpoint at step 2 and keeps training until it is stopped."""
    digests = host.write_folder(f"{folder}/out/checkpoints/checkpoint-2", {"adapter.safetensors": b"step 2"})
    host.emit(EventKind.CHECKPOINT, step=2, path="checkpoints/checkpoint-2", bytes=6, sha256=digests)


def finish(host: FakeHost, folder: str) -> None:
    """A trainer that goes on to the end: its adapter, then done."""
    files = host.write_folder(f"{folder}/out/adapter", {"adapter_model.safetensors": b"final weights"})
    host.emit(EventKind.DONE, adapter_path="adapter", files=files)


async def stopped_run(host: FakeHost, tmp_path: Path) -> tuple[RunEngine, str]:
    engine = RunEngine(RunStore(), SecretStore(), FAST, report=lambda _line: None, connect=host.connect)
    train = tmp_path / "train.jsonl"
    train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    spec = RunSpec("org/tiny-model", train, None, {"max_steps": 4}, SshTarget("trainer", "gpu.example", 22))
    run_id = engine.create(spec).id
    host.on_launch = checkpoint_then_wait
    driving = asyncio.ensure_future(engine.drive(run_id))
    while not (engine.folder(run_id) / "checkpoints" / "checkpoint-2").is_dir():
        await asyncio.sleep(0.01)
    await engine.stop(run_id)
    assert (await asyncio.wait_for(driving, 30)).state is RunState.CANCELLED
    return engine, run_id


async def test_a_stopped_run_resumes_from_its_checkpoint_and_finishes(host: FakeHost, tmp_path: Path) -> None:
    engine, run_id = await stopped_run(host, tmp_path)
    stopped = engine.store.get(run_id)
    assert resume_refusal(stopped) is None, "a run the user stopped can be taken up again"

    host.on_launch = finish
    resumed = engine.prepare_resume(run_id)
    assert resumed.state is RunState.PAUSED and resumed.pid is None
    assert not resumed.spec.get("stop_requested"), "the old stop request must not stop the resumed trainer"
    final = await asyncio.wait_for(engine.drive(run_id), 30)

    assert final.state is RunState.FINISHED, final.error
    assert host.launches == 2, "the trainer was started again, on the same machine"
    uploaded = [name for name in host.files if "out/checkpoints/checkpoint-2/" in name]
    assert uploaded, "the checkpoint at home went along, so the trainer resumes from it"
    history = [t["to_state"] for t in engine.store.transitions(run_id)]
    assert history[history.index("cancelled") :][:3] == ["cancelled", "paused", "connecting"]
    assert any(e["event"] == EventKind.STATE and e["state"] == JobState.FAILED for e in host.events)


async def test_a_run_stopped_at_its_budget_or_finished_is_not_resumed(host: FakeHost, tmp_path: Path) -> None:
    engine, run_id = await stopped_run(host, tmp_path)
    spec = engine.store.get(run_id).spec
    engine.store.update(run_id, spec={**spec, "budget_stop": "budget of $1.00 reached"})
    refusal = resume_refusal(engine.store.get(run_id))
    assert refusal is not None and "budget" in refusal
    with pytest.raises(RunError, match="budget"):
        engine.prepare_resume(run_id)
    assert engine.store.get(run_id).state is RunState.CANCELLED


def test_only_an_explicit_resume_reopens_a_stopped_run() -> None:
    with pytest.raises(TransitionError):
        check_transition(RunState.CANCELLED, RunState.PAUSED)
    with pytest.raises(TransitionError):
        check_transition(RunState.FINISHED, RunState.PAUSED, reopen=True)
    with pytest.raises(TransitionError):
        check_transition(RunState.CANCELLED, RunState.TRAINING, reopen=True)
    check_transition(RunState.CANCELLED, RunState.PAUSED, reopen=True)


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


def test_rentune_resume_says_why_a_finished_or_budget_stopped_run_does_not_go_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from desktop.cli import main

    store = RunStore()
    finished = store.create({"base_model": "m", "training": {}}, "ssh://me@127.0.0.1:1").id
    for state in (RunState.CONNECTING, RunState.TRAINING, RunState.SYNCING, RunState.PULLING, RunState.FINISHED):
        store.transition(finished, state)
    budget = store.create({"base_model": "m", "training": {}, "budget_stop": "budget of $1.00 reached"}, None).id
    store.transition(budget, RunState.CANCELLED)

    assert main(["resume", finished]) == 0
    assert "already finished: it finished: its adapter is on this computer" in capsys.readouterr().out
    assert main(["resume", budget]) == 1
    assert "stopped at its budget" in capsys.readouterr().out
    assert store.get(budget).state is RunState.CANCELLED


def test_a_rented_run_whose_key_was_forgotten_gets_a_new_one_for_its_next_machine() -> None:
    store = RunStore()
    spec = {"base_model": "m", "training": {}, "compute": {"provider": "runpod"}, "run_key_public": "ssh-ed25519 OLD"}
    run_id = store.create(spec, None).id
    store.transition(run_id, RunState.CANCELLED, "stopped before the trainer started")
    assert load_run_key(run_id) is None
    engine = RunEngine(store, SecretStore(), FAST)

    resumed = engine.prepare_resume(run_id)

    assert resumed.state is RunState.PAUSED
    key = load_run_key(run_id)
    assert key is not None and resumed.spec["run_key_public"] == key.export_public_key().decode().strip()
