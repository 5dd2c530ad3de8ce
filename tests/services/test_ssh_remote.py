"""Transfers and host-key pinning against the real loopback sshd."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from desktop.services.machines import openssh_sftp
from desktop.services.machines import ssh as ssh_remote
from desktop.services.machines.ssh import (
    CommandFailedError,
    Endpoint,
    HostKeyChangedError,
    RemoteError,
    RemoteMachine,
    fingerprint,
)
from desktop.services.platform.files import Segment
from desktop.services.platform.programs import find_openssh
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


async def test_a_command_that_exits_non_zero_is_the_machines_answer_with_its_status_and_words(
    ssh_host: SshHost,
) -> None:
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        folder = "/proc/rentune-nonexistent/work"  # no login, not even root, can create it
        with pytest.raises(CommandFailedError) as failed:
            await machine.run(f"echo starting; mkdir -p {folder}")
        assert failed.value.exit_status == 1
        assert (
            failed.value.said == "mkdir: cannot create directory '/proc/rentune-nonexistent': No such file or directory"
        )
        with pytest.raises(CommandFailedError) as quiet:
            await machine.run("echo 'only on stdout'; exit 7")
        assert (quiet.value.exit_status, quiet.value.said) == (7, "only on stdout")
        assert await machine.run("echo out; exit 3", check=False) == "out\n"
    finally:
        await machine.close()


@pytest.fixture(params=["builtin", "openssh"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs an upload test with asyncssh copying, then with OpenSSH's sftp copying (every size goes to it)."""
    if request.param == "builtin":
        monkeypatch.setenv("RENTUNE_TRANSFER", "builtin")
        yield request.param
        return
    if find_openssh() is None:
        pytest.fail("OpenSSH's sftp, ssh-agent and ssh-add are needed (apt install openssh-client)", pytrace=False)
    monkeypatch.setattr(openssh_sftp, "OPENSSH_MIN_BYTES", 0)
    copies: list[str] = []
    copy = ssh_remote.copy_with_sftp

    async def counted(*args: Any, **kwargs: Any) -> None:
        copies.append(str(args[3]))
        await copy(*args, **kwargs)

    monkeypatch.setattr(ssh_remote, "copy_with_sftp", counted)
    yield request.param
    assert copies, "sftp was meant to copy"


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB segments, so a few MB make an upload of several remotely checked segments."""
    monkeypatch.setattr(ssh_remote, "SEGMENT", 1 << 20)


async def test_broken_upload_and_download_continue_and_verify(
    ssh_host: SshHost, tmp_path: Path, transport: str
) -> None:
    data = os.urandom(3_000_000)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    remote = tmp_path / "remote" / "blob.bin"
    remote.parent.mkdir()
    remote.write_bytes(data[:1_234_567])  # an upload cut short
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        sent: list[int] = []
        await machine.upload(local, str(remote), progress=lambda _n, done, _t: sent.append(done))
        assert remote.read_bytes() == data
        assert sent[0] >= 1_234_567 and sent[-1] == len(data)  # it continued where the copy stopped
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
    data = os.urandom(500_000)
    remote = tmp_path / "r.bin"
    remote.write_bytes(data)
    back = tmp_path / "b.bin"
    (tmp_path / "b.bin.part").write_bytes(b"\0" * 1000)  # wrong bytes, right place
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        with pytest.raises(RemoteError, match="did not verify"):
            await machine.download(str(remote), back)
        assert not back.exists() and not (tmp_path / "b.bin.part").exists()  # checked before it takes its name
        await machine.download(str(remote), back)
        assert back.read_bytes() == data
    finally:
        await machine.close()


def bytes_read() -> int:
    """Bytes this process has read through read(2) and kin so far (Linux /proc)."""
    line = next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:"))
    return int(line.split()[1])


async def test_a_fresh_upload_reads_the_file_once(
    ssh_host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With asyncssh copying (sftp reads the file in its own process: see test_openssh_sftp's pace test)."""
    monkeypatch.setenv("RENTUNE_TRANSFER", "builtin")
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(24_000_000))
    remote = tmp_path / "remote" / "deep" / "big.bin"  # folders made on the way
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        before = bytes_read()
        await machine.upload(local, str(remote))
        read = bytes_read() - before
    finally:
        await machine.close()
    assert remote.read_bytes() == local.read_bytes()
    assert read < 1.2 * 24_000_000  # hashed while sent: not read once to hash and again to send


async def test_a_complete_remote_file_is_not_sent_again(ssh_host: SshHost, tmp_path: Path, transport: str) -> None:
    local = tmp_path / "blob.bin"
    local.write_bytes(os.urandom(2_500_000))
    remote = tmp_path / "remote.bin"
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        await machine.upload(local, str(remote))
        os.utime(remote, (1_000_000_000, 1_000_000_000))
        sent: list[int] = []
        await machine.upload(local, str(remote), progress=lambda _n, done, _t: sent.append(done))
        assert sent == [] and remote.stat().st_mtime == 1_000_000_000  # only hashed, never written
        remote.write_bytes(os.urandom(2_500_000))  # same size, other bytes: sent again, whole
        await machine.upload(local, str(remote))
        assert remote.read_bytes() == local.read_bytes()
    finally:
        await machine.close()


async def test_a_partial_remote_file_of_other_bytes_is_replaced(
    ssh_host: SshHost, tmp_path: Path, transport: str
) -> None:
    data = os.urandom(3_000_000)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    remote = tmp_path / "remote.bin"
    remote.write_bytes(os.urandom(1_500_000))  # a partial copy of another version of the file
    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        await machine.upload(local, str(remote))
    finally:
        await machine.close()
    assert remote.read_bytes() == data


@pytest.mark.parametrize("hasher", ["python3", "no-such-python"], ids=["python-hasher", "shell-hasher"])
async def test_an_upload_that_lands_wrong_is_deleted_and_refused(
    ssh_host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hasher: str, transport: str
) -> None:
    """Both remote hashers (Python reading in place, and the tail | head | sha256 loop without it) catch a bad byte."""
    monkeypatch.setattr(ssh_remote, "SEGMENT_PYTHON", hasher)
    data = os.urandom(3_000_000)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    remote = tmp_path / "remote.bin"
    check = ssh_remote._SegmentChecks.start

    def land_wrong(self: ssh_remote._SegmentChecks, segment: Segment) -> None:  # the remote disk garbles one byte
        if segment.offset == 1 << 20:
            with remote.open("r+b") as handle:
                handle.seek(segment.offset + 10)
                handle.write(bytes([data[segment.offset + 10] ^ 0xFF]))
        check(self, segment)

    machine = await RemoteMachine.connect(endpoint(ssh_host), None)
    try:
        monkeypatch.setattr(ssh_remote._SegmentChecks, "start", land_wrong)
        with pytest.raises(RemoteError, match="did not verify"):
            await machine.upload(local, str(remote))
        assert not remote.exists()
        monkeypatch.setattr(ssh_remote._SegmentChecks, "start", check)
        await machine.upload(local, str(remote))
    finally:
        await machine.close()
    assert hashlib.sha256(remote.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
