"""A host key pinned in SPEC.toml (by the wizard's Test connection) is carried into the run and enforced."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from desktop.core.runs.spec import RunSpecError, run_spec_from_dict
from desktop.core.runs.states import RunState
from desktop.services.machines.ssh import fingerprint
from desktop.services.runs.engine import EngineOptions, RunEngine, RunError
from desktop.services.runs.store import RunStore
from tests.fixtures.sshd import SshHost
from tests.runs.conftest import SpecFactory

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU"


def spec_with_host_key(path: Path, host_key: str):  # type: ignore[no-untyped-def]
    data = tomllib.loads(path.read_text())
    data["target"]["host_key"] = host_key
    return run_spec_from_dict(data, path.parent, path)


def test_spec_toml_host_key_is_parsed_and_checked(ssh_host: SshHost, make_spec: SpecFactory) -> None:
    path = make_spec(ssh_host)
    spec = spec_with_host_key(path, ssh_host.host_public_key + " comment")
    assert spec.target is not None and spec.target.host_key == " ".join(ssh_host.host_public_key.split()[:2])
    plain = run_spec_from_dict(tomllib.loads(path.read_text()), path.parent, path)
    assert plain.target is not None and plain.target.host_key is None, "absent: pinned on first contact"
    with pytest.raises(RunSpecError, match=r"\[target\] host_key must be the host's public key line"):
        spec_with_host_key(path, "SHA256:not-a-key")


def test_create_presets_the_pinned_key_in_the_record(ssh_host: SshHost, make_spec: SpecFactory) -> None:
    record = RunEngine(RunStore()).create(spec_with_host_key(make_spec(ssh_host), ssh_host.host_public_key))
    assert record.host_key is not None and record.host_key.split()[:2] == ssh_host.host_public_key.split()[:2]
    assert record.fingerprint == fingerprint(ssh_host.host_public_key)
    with pytest.raises(RunError, match="host_key is not a valid public key"):
        RunEngine(RunStore()).create(spec_with_host_key(make_spec(ssh_host), "ssh-ed25519 AAAAnot-base64"))


async def test_the_engine_refuses_a_host_with_another_key(ssh_host: SshHost, make_spec: SpecFactory) -> None:
    engine = RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2))
    record = engine.create(spec_with_host_key(make_spec(ssh_host), OTHER_KEY))
    final = await engine.drive(record.id)
    assert final.state is RunState.FAILED
    assert final.error is not None and "host key" in final.error and fingerprint(OTHER_KEY) in final.error
    assert final.host_key == OTHER_KEY, "the pinned key is kept, not replaced by the offered one"
    authorized = (ssh_host.server.directory / "authorized_keys").read_text()
    assert "rentune-run-" not in authorized, "nothing was installed on a machine that failed the key check"
