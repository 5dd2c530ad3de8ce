"""The engine never bills for nothing: a failed install fails the run, a cut bootstrap is followed, not repeated.

An interrupted finish is not retrained: test_engine_logic (the app closed while the adapter comes home).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from desktop.core.runs.states import RunState
from desktop.services.platform.secrets import SecretStore
from desktop.services.renting.manager import RunManager
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory
from tests.runs.test_engine_end_to_end import engine, load
from trainer_payload.failures import hint
from trainer_payload.protocol import ErrorKind

pytestmark = pytest.mark.slow


async def test_stop_before_the_trainer_starts_ends_the_run_at_once(ssh_host: SshHost, make_spec: SpecFactory) -> None:
    manager = RunManager(RunStore(), SecretStore())
    record = manager.launch(load(make_spec(ssh_host)))
    await asyncio.sleep(0)  # following has begun: connecting or uploading
    stopped = await asyncio.wait_for(manager.stop(record.id), 30)
    assert stopped.state is RunState.CANCELLED
    assert not manager.is_driving(record.id)


def python_wrapper(folder: Path, *extra: str, delay_s: float = 0) -> tuple[Path, Path]:
    """A stand-in for the machine's Python that logs each start, may wait first and may add arguments."""
    calls, wrapper = folder / "python-starts.log", folder / "python-wrapper"
    wrapper.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\nsleep {delay_s}\nexec {sys.executable} "$@" {" ".join(extra)}\n'
    )
    wrapper.chmod(0o755)
    return wrapper, calls


def with_python(spec_path: Path, python: Path) -> Path:
    spec_path.write_text(spec_path.read_text().replace(f'python = "{sys.executable}"', f'python = "{python}"'))
    return spec_path


async def test_a_connection_cut_while_bootstrapping_follows_the_same_bootstrap(
    ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path
) -> None:
    python, starts = python_wrapper(tmp_path, delay_s=3)
    runner = engine()
    record = runner.create(load(with_python(make_spec(ssh_host, max_steps=5), python)))
    drive = asyncio.ensure_future(runner.drive(record.id))

    async def bootstrap_started() -> None:
        while not starts.exists():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(bootstrap_started(), 600)
    assert ssh_host.server.cut_connections() >= 1
    final = await asyncio.wait_for(drive, 600)
    assert final.state is RunState.FINISHED, final.error
    assert len(starts.read_text().splitlines()) == 1, "the reconnect followed the running bootstrap"
    history = [t["to_state"] for t in RunStore().transitions(record.id)]
    assert history.count("uploading") == 1 and history.count("bootstrapping") == 1
    events = mirrored_events(RunStore().folder(record.id))
    assert [e.get("step") for e in events if e["event"] == "state" and e["state"] == "installing"][:2] == [
        "environment",
        "check",
    ]
    assert sum(1 for e in events if e.get("ready") is True) == 1
    assert (tmp_path / "remote" / record.id / ".venv" / "bin" / "python").exists(), "the trainer's venv"


async def test_a_failing_pip_fails_the_run_once_with_pips_words_and_the_hint(
    ssh_host: SshHost, make_spec: SpecFactory, tmp_path: Path
) -> None:
    lock = tmp_path / "requirements-lock.txt"
    lock.write_text(f"rentune-no-such-package==1.0 --hash=sha256:{'1' * 64}\n")
    python, starts = python_wrapper(tmp_path, "--lock", str(lock))
    runner = engine()
    record = runner.create(load(with_python(make_spec(ssh_host), python)))
    final = await asyncio.wait_for(runner.drive(record.id), 600)
    assert final.state is RunState.FAILED
    assert final.error is not None
    assert final.error.startswith("preparing the machine failed (install): installing rentune-no-such-package==1.0")
    assert "No matching distribution found for rentune-no-such-package==1.0" in final.error
    assert hint(ErrorKind.INSTALL) in final.error
    assert len(starts.read_text().splitlines()) == 1 and final.pid is None, "no retry, no trainer"
