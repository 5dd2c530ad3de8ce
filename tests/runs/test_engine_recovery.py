"""The engine never bills for nothing: a failed install fails the run, an interrupted finish is not retrained."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.states import RunState
from desktop.services.run_engine import RunEngine, mirrored_events
from desktop.services.run_manager import RunManager
from desktop.services.run_store import RunStore
from desktop.services.secrets import SecretStore
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory
from tests.runs.test_engine_end_to_end import engine, load

pytestmark = pytest.mark.slow


async def test_a_failed_install_fails_the_run_with_the_reason_instead_of_retrying(
    ssh_host: SshHost, make_spec: SpecFactory
) -> None:
    spec_path = make_spec(ssh_host)
    spec_path.write_text(spec_path.read_text().replace("python = ", 'python = "/no/such/python" # '))
    runner = engine()
    record = runner.create(load(spec_path))
    final = await asyncio.wait_for(runner.drive(record.id), 60)
    assert final.state is RunState.FAILED
    assert final.error and "preparing the machine failed" in final.error and "[target] python" in final.error


async def test_an_app_closed_while_the_adapter_comes_home_finishes_on_reattach_without_retraining(
    ssh_host: SshHost, make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runner = engine()
    record = runner.create(load(make_spec(ssh_host, max_steps=12, checkpoint_steps=6)))

    async def closed_mid_download(self: RunEngine, run_id: str, machine: Any, event: dict[str, Any]) -> None:
        raise asyncio.CancelledError  # the app quits while the adapter is being pulled

    with monkeypatch.context() as patch:
        patch.setattr(RunEngine, "_finish", closed_mid_download)
        with contextlib.suppress(asyncio.CancelledError):
            await runner.drive(record.id)
    assert RunStore().get(record.id).state is not RunState.FINISHED
    final = await asyncio.wait_for(engine().drive(record.id), 120)
    assert final.state is RunState.FINISHED and final.adapter
    assert final.relaunches == 0, "the trainer that had finished was not started again"
    events = mirrored_events(RunStore().folder(record.id))
    assert sum(1 for e in events if e["event"] == "state" and e["state"] == "training") == 1
    assert (tmp_path / "remote" / record.id / "model" / "config.json").is_file(), "the local model folder went along"


async def test_stop_before_the_trainer_starts_ends_the_run_at_once(ssh_host: SshHost, make_spec: SpecFactory) -> None:
    manager = RunManager(RunStore(), SecretStore())
    record = manager.launch(load(make_spec(ssh_host)))
    await asyncio.sleep(0)  # following has begun: connecting or uploading
    stopped = await asyncio.wait_for(manager.stop(record.id), 30)
    assert stopped.state is RunState.CANCELLED
    assert not manager.is_driving(record.id)
