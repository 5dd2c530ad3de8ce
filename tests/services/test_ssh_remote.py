"""Transfers and host-key pinning against the real loopback sshd."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from desktop.services.ssh_remote import Endpoint, HostKeyChangedError, RemoteMachine, fingerprint
from tests.fixtures.sshd import SshHost


def endpoint(host: SshHost) -> Endpoint:
    return Endpoint(host.host, host.port, host.user, (host.client_key,))


async def test_first_contact_pins_and_later_contacts_verify(ssh_host: SshHost) -> None:
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    await machine.close()
    assert machine.host_key.split()[:2] == ssh_host.host_public_key.split()[:2]
    assert fingerprint(machine.host_key).startswith("SHA256:")
    again = await RemoteMachine.connect(endpoint(ssh_host), machine.host_key)
    await again.close()
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU"
    with pytest.raises(HostKeyChangedError, match="changed"):
        await RemoteMachine.connect(endpoint(ssh_host), other)


async def test_broken_upload_and_download_continue_and_verify(ssh_host: SshHost, tmp_path: Path) -> None:
    data = os.urandom(3_000_000)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    remote = tmp_path / "remote" / "blob.bin"
    remote.parent.mkdir()
    remote.write_bytes(data[:1_234_567])  # an upload cut short
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        await machine.upload(local, str(remote))
        assert remote.read_bytes() == data
        back = tmp_path / "home" / "blob.bin"
        back.parent.mkdir()
        (back.parent / "blob.bin.part").write_bytes(data[:777_777])  # a download cut short
        seen: list[int] = []
        await machine.download(str(remote), back, progress=lambda _n, done, _t: seen.append(done))
        assert back.read_bytes() == data
        assert seen[0] > 777_777 and seen[-1] == len(data)
    finally:
        await machine.close()


async def test_a_corrupt_partial_download_is_refused_then_fetched_again(ssh_host: SshHost, tmp_path: Path) -> None:
    from desktop.services.ssh_remote import RemoteError

    data = os.urandom(500_000)
    remote = tmp_path / "r.bin"
    remote.write_bytes(data)
    back = tmp_path / "b.bin"
    (tmp_path / "b.bin.part").write_bytes(b"\0" * 1000)  # wrong bytes, right place
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        with pytest.raises(RemoteError, match="did not verify"):
            await machine.download(str(remote), back)
        await machine.download(str(remote), back)
        assert back.read_bytes() == data
    finally:
        await machine.close()
