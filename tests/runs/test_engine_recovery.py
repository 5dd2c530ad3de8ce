"""The engine never bills for nothing: a failed install fails the run (a cut bootstrap is followed, not repeated:
test_engine_end_to_end's cut-connection run).

An interrupted finish is not retrained: test_engine_logic (the app closed while the adapter comes home).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.core.runs.states import RunState
from desktop.services.platform.secrets import SecretStore
from desktop.services.renting.manager import RunManager
from desktop.services.runs.store import RunStore
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory, python_wrapper, with_python
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
    log = runner.folder(record.id) / "bootstrap.log"  # over SFTP: the machine may be gone next
    assert "No matching distribution found for rentune-no-such-package==1.0" in log.read_text()
    assert final.error.endswith(f"The machine's log is on this computer: {log}")
