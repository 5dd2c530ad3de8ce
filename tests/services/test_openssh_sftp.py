"""Large uploads through OpenSSH's sftp: the run key from a private agent, the pinned host key, paced hashing."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import asyncssh
import pytest

from desktop.services.machines import openssh_sftp
from desktop.services.machines.openssh_sftp import (
    OpenSshUnusableError,
    Pace,
    hash_segments,
    suits_openssh,
)
from desktop.services.machines.ssh import Endpoint, RemoteError, RemoteMachine
from desktop.services.platform.files import Segment
from desktop.services.platform.programs import find_openssh
from tests.fixtures.sshd import SshServer

OTHER_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU"


@pytest.fixture(autouse=True)
def needs_openssh() -> None:
    if find_openssh() is None:
        pytest.fail("OpenSSH's sftp, ssh-agent and ssh-add are needed (apt install openssh-client)", pytrace=False)


def run_key_endpoint(server: SshServer) -> Endpoint:
    """A login with an in-memory run key only (authorised on the server), as the engine logs in."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment="rentune-run-test")
    with (server.directory / "authorized_keys").open("a", encoding="utf-8") as handle:
        handle.write(key.export_public_key().decode())
    host = server.host()
    return Endpoint(host.host, host.port, host.user, (key,))


async def test_the_run_key_logs_sftp_in_from_a_private_agent_and_never_touches_the_disk(
    ssh_server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(20 << 20)
    local = tmp_path / "data.bin"
    local.write_bytes(data)
    remote = tmp_path / "remote" / "data.bin"
    seen: list[tuple[Path, list[str]]] = []
    command = openssh_sftp.SftpLogin.command

    def looked_at(login: openssh_sftp.SftpLogin) -> list[str]:  # what lies in the login's folder while sftp runs
        files = [path.read_bytes().decode(errors="replace") for path in login.folder.iterdir() if path.is_file()]
        seen.append((login.folder, files))
        return command(login)

    monkeypatch.setattr(openssh_sftp.SftpLogin, "command", looked_at)
    machine = await RemoteMachine.connect(run_key_endpoint(ssh_server), None)
    try:
        await machine.upload(local, str(remote))
    finally:
        await machine.close()
    assert hashlib.sha256(remote.read_bytes()).digest() == hashlib.sha256(data).digest()
    ((folder, files),) = seen
    assert files and not any("PRIVATE KEY" in text for text in files), "only public keys and the host key on disk"
    assert any(text.startswith("ssh-ed25519") and "rentune-run-test" in text for text in files)
    assert not folder.exists(), "the login's folder (and the agent's socket) is gone after the copy"


async def test_sftp_accepts_only_the_pinned_host_key_and_the_copy_goes_the_built_in_way(
    ssh_server: SshServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(17 << 20))
    remote = tmp_path / "data-copy.bin"
    machine = await RemoteMachine.connect(run_key_endpoint(ssh_server), None)
    machine.host_key = OTHER_HOST_KEY  # as if another machine answered sftp's own connection
    try:
        with caplog.at_level(logging.WARNING):
            await machine.upload(local, str(remote))
    finally:
        await machine.close()
    assert remote.read_bytes() == local.read_bytes()  # sent over the connection whose key was verified
    assert "Host key verification failed" in caplog.text and "built-in client" in caplog.text


async def test_without_openssh_or_when_asked_uploads_use_the_built_in_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RENTUNE_TRANSFER", "builtin")
    assert find_openssh() is None
    monkeypatch.delenv("RENTUNE_TRANSFER")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sftp on it
    assert find_openssh() is None
    big = tmp_path / "big.bin"
    with big.open("wb") as handle:
        handle.truncate(16 << 20)
    assert suits_openssh(big, "/workspace/run/data/train.jsonl", 16 << 20)
    assert not suits_openssh(big, "/workspace/run/data/train.jsonl", (16 << 20) - 1)  # small: not worth a login
    assert not suits_openssh(big, '/workspace/a "quoted" name', 16 << 20)  # sftp's batch syntax cannot carry it
    assert not suits_openssh(big, "-rf", 16 << 20)


def test_sftp_exits_become_clear_outcomes() -> None:
    openssh_sftp._raise_for(0, "", "data.bin", sent_some=False)
    with pytest.raises(OpenSshUnusableError, match="Permission denied"):
        openssh_sftp._raise_for(255, "root@h: Permission denied (publickey).\r\n", "data.bin", sent_some=False)
    with pytest.raises(RemoteError, match=r"sftp could not copy data.bin \(Connection reset by peer\)"):
        openssh_sftp._raise_for(255, "Connection reset by peer\n", "data.bin", sent_some=True)
    with pytest.raises(RemoteError, match="remote write: Failure"):
        openssh_sftp._raise_for(1, "remote write: Failure\n", "data.bin", sent_some=True)


def test_hashing_keeps_pace_with_what_has_landed(tmp_path: Path) -> None:
    """The hashing thread reads no further than what sftp has just read: the disk is read once."""
    data = os.urandom(10 << 20)
    local = tmp_path / "data.bin"
    local.write_bytes(data)
    pace = Pace(0, 2 << 20)
    delivered: list[Segment] = []
    worker = threading.Thread(
        target=hash_segments,
        args=(local, 0, len(data)),
        kwargs={"segment": 4 << 20, "pace": pace, "deliver": delivered.append},
    )
    worker.start()
    time.sleep(0.3)
    assert delivered == [] and worker.is_alive(), "held at 2 MiB: the first 4 MiB segment is not hashed yet"
    pace.allow(4 << 20)
    deadline = time.monotonic() + 5
    while len(delivered) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s.offset for s in delivered] == [0] and worker.is_alive(), "one segment, then held again"
    pace.allow(len(data))
    worker.join(5)
    assert not worker.is_alive()
    assert sum(s.length for s in delivered) == len(data)
    for segment in delivered:
        expected = hashlib.sha256(data[segment.offset : segment.offset + segment.length]).hexdigest()
        assert segment.sha256 == expected


def test_a_stopped_pace_releases_the_hashing_thread(tmp_path: Path) -> None:
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(4 << 20))
    pace = Pace(0, 1 << 20)
    worker = threading.Thread(
        target=hash_segments,
        args=(local, 0, 4 << 20),
        kwargs={"segment": 1 << 20, "pace": pace, "deliver": lambda _segment: None},
    )
    worker.start()
    pace.stop()  # the copy failed: the thread must not wait for landings that never come
    worker.join(5)
    assert not worker.is_alive()


async def test_a_cancelled_copy_leaves_no_sftp_or_agent_running(ssh_server: SshServer, tmp_path: Path) -> None:
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(64 << 20))
    machine = await RemoteMachine.connect(run_key_endpoint(ssh_server), None)
    started: list[openssh_sftp.SftpLogin] = []
    command = openssh_sftp.SftpLogin.command

    def remembered(login: openssh_sftp.SftpLogin) -> list[str]:
        started.append(login)
        return command(login)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(openssh_sftp.SftpLogin, "command", remembered)
            upload = asyncio.ensure_future(machine.upload(local, str(tmp_path / "copy.bin")))
            deadline = time.monotonic() + 60
            while not started:  # the copy may also have gone the built-in way: then it would never start
                assert time.monotonic() < deadline and not upload.done(), "sftp never started"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            upload.cancel()
            with pytest.raises(asyncio.CancelledError):
                await upload
    finally:
        await machine.close()
    login = started[0]
    assert login._agent is not None and login._agent.returncode is not None, "the agent was stopped"
    assert not login.folder.exists()
    pgrep = await asyncio.create_subprocess_exec("pgrep", "-f", str(login.folder), stdout=asyncio.subprocess.PIPE)
    left, _ = await pgrep.communicate()
    assert left == b"", "no sftp (or ssh under it) is left running"


async def test_an_agent_not_listening_yet_is_offered_the_key_again(tmp_path: Path) -> None:
    """ssh-agent makes its socket before it listens: an ssh-add in between is refused, and tried again."""
    tools = find_openssh()
    assert tools is not None
    tries = tmp_path / "tries"
    wrapper = tmp_path / "ssh-add"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{tries}"\n'
        f'if [ "$(wc -l < "{tries}")" -le 2 ]; then cat > /dev/null; '
        'echo "Error connecting to agent: Connection refused" >&2; exit 2; fi\n'
        f'exec "{tools.add}" "$@"\n'
    )
    wrapper.chmod(0o755)
    key = asyncssh.generate_private_key("ssh-ed25519")
    host_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    endpoint = Endpoint("127.0.0.1", 22, "me", (key,))
    async with openssh_sftp.SftpLogin(replace(tools, add=str(wrapper)), endpoint, host_key) as login:
        assert login._agent is not None and login._agent.returncode is None
    assert tries.read_text().count("x") == 3  # refused twice while "not listening", taken the third time
