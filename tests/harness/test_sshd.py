"""The sshd fixture is a real OpenSSH server that behaves like a rented machine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncssh
import pytest

from tests.fixtures.sshd import SshHost, SshServer


async def test_key_login_runs_a_command_with_the_host_key_pinned(ssh_host: SshHost) -> None:
    async with asyncssh.connect(**ssh_host.connect_kwargs()) as conn:
        result = await conn.run("echo hello from $(whoami)", check=True)
    assert result.stdout == f"hello from {ssh_host.user}\n"


async def test_sessions_get_one_math_thread_and_the_tests_own_variables(ssh_server: SshServer) -> None:
    ssh_server.extra_config = ["SetEnv RENTUNE_PROBE=yes"]  # sshd keeps only its first SetEnv line: merged
    ssh_server.stop()
    ssh_server.start()
    async with asyncssh.connect(**ssh_server.host().connect_kwargs()) as conn:
        result = await conn.run("echo $OMP_NUM_THREADS $MKL_NUM_THREADS $RENTUNE_PROBE", check=True)
    assert result.stdout == "1 1 yes\n"


async def test_sftp_subsystem_transfers_a_file(ssh_host: SshHost, tmp_path: Path) -> None:
    local = tmp_path / "up.bin"
    local.write_bytes(bytes(range(256)) * 100)
    remote = tmp_path / "remote.bin"
    async with asyncssh.connect(**ssh_host.connect_kwargs()) as conn, conn.start_sftp_client() as sftp:
        await sftp.put(str(local), str(remote))
    assert remote.read_bytes() == local.read_bytes()


async def test_a_different_host_key_is_refused(ssh_host: SshHost) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    kwargs = ssh_host.connect_kwargs() | {
        "known_hosts": asyncssh.import_known_hosts(f"[127.0.0.1]:{ssh_host.port} {other}")
    }
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await asyncssh.connect(**kwargs)


async def test_detached_process_survives_the_connection_being_cut(ssh_host: SshHost, tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    job = f"sleep 1.5; echo done > {marker}"
    launch = f"cd {tmp_path}; setsid nohup sh -c '{job}' > job.log 2>&1 < /dev/null & echo $!"
    async with asyncssh.connect(**ssh_host.connect_kwargs()) as conn:
        result = await asyncio.wait_for(conn.run(launch, check=True), timeout=5)
        pid = int(result.stdout.strip())
    ssh_host.server.cut_connections()  # the serving processes die, as on a network drop
    assert _running(pid), "the detached job died with its SSH session"
    assert not marker.exists()
    await asyncio.sleep(2.5)
    assert marker.read_text() == "done\n"
    assert not _running(pid)


def _running(pid: int) -> bool:
    """True while ``pid`` runs; a finished child that nobody reaped (a zombie) counts as finished."""
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


async def test_cutting_connections_kills_the_session_and_a_restart_accepts_again(ssh_host: SshHost) -> None:
    conn = await asyncssh.connect(**ssh_host.connect_kwargs())
    assert ssh_host.server.session_pids()
    assert ssh_host.server.cut_connections() >= 1
    with pytest.raises((asyncssh.Error, OSError)):
        await asyncio.wait_for(conn.run("true", check=True), timeout=5)
    conn.close()
    ssh_host.server.restart()
    async with asyncssh.connect(**ssh_host.connect_kwargs()) as again:
        assert (await again.run("echo ok", check=True)).stdout == "ok\n"
