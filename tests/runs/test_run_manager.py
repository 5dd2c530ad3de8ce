"""The app's run manager against a real sshd: background driving, one driver per run, stop keeping a checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.core.runs.states import RunState
from desktop.services.platform.secrets import SecretStore
from desktop.services.renting.manager import RunManager
from desktop.services.runs.engine import EngineOptions, RunBusyError, RunEngine
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory
from tests.runs.test_engine_end_to_end import load, wait_local_event

pytestmark = pytest.mark.slow


def manager() -> RunManager:
    return RunManager(RunStore(), SecretStore(), EngineOptions(poll_seconds=0.2))


async def test_a_second_driver_of_the_same_run_is_refused(ssh_host: SshHost, make_spec: SpecFactory) -> None:
    runs = manager()
    lines: list[tuple[str, str]] = []
    runs.add_listener(lambda run_id, line: lines.append((run_id, line)))
    record = runs.launch(load(make_spec(ssh_host, max_steps=100_000, checkpoint_steps=20)))  # stopped long before
    assert runs.is_driving(record.id)
    folder = runs.store.folder(record.id)
    await wait_local_event(folder, lambda e: e["event"] == "step")
    with pytest.raises(RunBusyError, match="already being followed"):
        await RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2)).drive(record.id)
    await wait_local_event(folder, lambda e: e["event"] == "checkpoint")
    pulled = await runs.pull(record.id)
    for _ in range(50):  # the tiny model checkpoints faster than a pull: the newest known may already be rotated
        if pulled is not None:
            break
        await asyncio.sleep(0.2)
        pulled = await runs.pull(record.id)
    assert pulled is not None and pulled.name.startswith("checkpoint-")
    stopped = await runs.stop(record.id)
    assert stopped.state is RunState.CANCELLED
    assert not runs.is_driving(record.id)
    assert any(run_id == record.id and "trainer started" in line for run_id, line in lines)
    newest = max(int(p.name.split("-")[1]) for p in (folder / "checkpoints").glob("checkpoint-*"))
    steps = [e["step"] for e in mirrored_events(folder) if e["event"] == "step"]
    assert newest >= max(steps) - 1, "the checkpoint written on stop is home"


async def test_reattach_follows_live_runs_after_the_app_restarts(
    ssh_host: SshHost, make_spec: SpecFactory, rentune_home: Path
) -> None:
    first = manager()
    record = first.launch(load(make_spec(ssh_host, max_steps=30)))
    await wait_local_event(first.store.folder(record.id), lambda e: e["event"] == "step")
    await first.close()  # the app quits mid-run: the trainer goes on
    second = manager()
    assert second.reattach_all() == [record.id]
    final = await asyncio.wait_for(second.wait(record.id), 240)
    assert final.state is RunState.FINISHED and final.adapter
