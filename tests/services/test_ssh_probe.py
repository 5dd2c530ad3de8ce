"""Testing a host before a run, against the real loopback sshd."""

from __future__ import annotations

import platform
import shutil
import socket
import sys
from importlib.util import find_spec
from pathlib import Path

import asyncssh
import pytest

from desktop.services.machines.probe import NO_GPU, ProbeError, probe_host
from desktop.services.machines.ssh import Endpoint, HostKeyChangedError, fingerprint
from tests.fixtures.sshd import SshHost

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU"


def endpoint(host: SshHost, key: Path | None = None, port: int | None = None) -> Endpoint:
    return Endpoint(host.host, port or host.port, host.user, (key or host.client_key,))


async def test_first_test_pins_the_host_key_and_reports_gpu_python_and_torch(ssh_host: SshHost) -> None:
    result = await probe_host(endpoint(ssh_host), None, sys.executable)
    assert result.host_key.split()[:2] == ssh_host.host_public_key.split()[:2]
    assert result.fingerprint == fingerprint(ssh_host.host_public_key)
    assert result.fingerprint.startswith("SHA256:")
    if shutil.which("nvidia-smi") is None:
        assert result.gpus == () and result.gpu_summary == NO_GPU
    else:
        assert result.gpus and "MiB" in result.gpu_summary
    assert result.python_version == platform.python_version()
    assert (result.torch_version is not None) == (find_spec("torch") is not None)
    assert result.python_summary.startswith(f"Python {platform.python_version()}")
    again = await probe_host(endpoint(ssh_host), result.host_key, "python3")
    assert again.fingerprint == result.fingerprint, "the pinned key is accepted on the next test"


async def test_a_changed_host_key_is_refused_with_the_way_out(ssh_host: SshHost) -> None:
    with pytest.raises(HostKeyChangedError, match="Forget pinned key") as caught:
        await probe_host(endpoint(ssh_host), OTHER_KEY)
    assert fingerprint(OTHER_KEY) in str(caught.value)
    assert "may be an attack" in str(caught.value)


async def test_a_missing_interpreter_is_reported_not_raised(ssh_host: SshHost) -> None:
    result = await probe_host(endpoint(ssh_host), None, "/nonexistent/python3")
    assert result.python_version == ""
    assert "/nonexistent/python3 was not found" in result.python_summary
    assert result.fingerprint == fingerprint(ssh_host.host_public_key)


async def test_a_key_the_server_does_not_know_names_the_key(ssh_host: SshHost, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger_ed25519"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    with pytest.raises(ProbeError, match="refused the login") as caught:
        await probe_host(endpoint(ssh_host, key=stranger), None)
    assert str(stranger) in str(caught.value) and "authorized_keys" in str(caught.value)


async def test_a_missing_key_file_is_named(ssh_host: SshHost, tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="does not exist"):
        await probe_host(endpoint(ssh_host, key=tmp_path / "nope"), None)


async def test_a_closed_port_names_host_and_port(ssh_host: SshHost) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ProbeError, match=f"nothing accepts SSH connections on 127.0.0.1:{port}"):
        await probe_host(endpoint(ssh_host, port=port), None)


async def test_a_silent_host_times_out_with_a_clear_message(ssh_host: SshHost) -> None:
    with socket.socket() as silent:  # accepts TCP but never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        with pytest.raises(ProbeError, match=f"127.0.0.1:{port} did not answer within 1 s"):
            await probe_host(endpoint(ssh_host, port=port), None, time_limit=1)
