"""An SSH machine seen from the app: pinned host key, commands, resumable verified transfers (asyncssh).

Host keys are pinned on first contact (like OpenSSH's ``accept-new``) and verified on every later connection; a
changed key is refused. Secrets go over a channel's stdin, never on a command line.
"""

from __future__ import annotations

import asyncio
import shlex
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import cast

import asyncssh

from desktop.services.files import sha256_file
from desktop.services.logs import get_logger

Progress = Callable[[str, int, int], None]
# SFTP requests in flight per copy: what makes asyncssh keep up with scp over fast links.
MAX_REQUESTS = 128
READS_IN_FLIGHT = 64
# Bytes handed to one SFTP write call; asyncssh splits it into parallel requests of the server's size.
CHUNK = 8 << 20
# AES-GCM first: with AES-NI it is the fastest cipher in both OpenSSH and Python's cryptography (~40 % faster
# SFTP than chacha20 here); the rest keep every OpenSSH server reachable.
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
)
# Printed before each command's own output: whatever a login shell prints first (an rc file that echoes) is cut off.
OUTPUT_MARKER = "__RENTUNE_OUTPUT__"
#: The most bytes :meth:`RemoteMachine.read_from` returns at once (a hostile machine may offer endless data).
READ_LIMIT = 8 << 20
_log = get_logger("ssh")


class HostKeyChangedError(ConnectionError):
    """The machine's host key is not the one pinned for this run."""


class RemoteError(RuntimeError):
    """A remote command failed; the message has its output."""


class LoginRefusedError(asyncssh.PermissionDenied):
    """The machine refused every key offered; the message names the login and the keys."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to log in."""

    host: str
    port: int
    user: str
    client_keys: tuple[Path | asyncssh.SSHKey, ...] = ()


class _PinningClient(asyncssh.SSHClient):
    """Accepts the host key pinned for the run, or any key on first contact (recording it)."""

    def __init__(self, pinned: str | None) -> None:
        self.pinned = pinned
        self.seen: asyncssh.SSHKey | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.seen = key
        offered = key.export_public_key().decode().strip()
        return self.pinned is None or offered.split()[:2] == self.pinned.split()[:2]


def describe_keys(keys: tuple[Path | asyncssh.SSHKey, ...]) -> str:
    """The keys offered for a login, for people: ``the run key (ed25519 SHA256:...) and ~/.ssh/id_x``."""
    names = [_key_name(key) for key in keys]
    if not names:
        return "no key (set [target] identity or --identity)"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _key_name(key: Path | asyncssh.SSHKey) -> str:
    if isinstance(key, Path):
        home = Path.home()
        return f"~/{key.relative_to(home)}" if key.is_relative_to(home) else str(key)
    kind = key.get_algorithm().removeprefix("ssh-")
    comment = key.get_comment() or ""
    owner = "the run key" if comment.startswith("rentune-run-") else f"key {comment}".strip()
    return f"{owner} ({kind} {key.get_fingerprint('sha256')})"


def _login_refused(endpoint: Endpoint) -> LoginRefusedError:
    return LoginRefusedError(
        f"login as {endpoint.user}@{endpoint.host}:{endpoint.port} refused for {describe_keys(endpoint.client_keys)}; "
        "check the user name, and add your public key to that login's ~/.ssh/authorized_keys on the machine (or "
        "choose the key it accepts with [target] identity / --identity), then resume the run"
    )


def fingerprint(public_key: str) -> str:
    """The SHA256 fingerprint OpenSSH shows for a public key line."""
    return str(asyncssh.import_public_key(public_key).get_fingerprint("sha256"))


class RemoteMachine:
    """One SSH connection to a training machine."""

    def __init__(self, conn: asyncssh.SSHClientConnection, host_key: str) -> None:
        self.conn = conn
        self.host_key = host_key

    @classmethod
    async def connect(cls, endpoint: Endpoint, pinned: str | None, time_limit: float = 20) -> RemoteMachine:
        """Connects with the host key pinned (or pins it now, when ``pinned`` is None).

        Raises:
            HostKeyChangedError: The host presents another key than the pinned one.
            LoginRefusedError: The host refused every key offered.
            OSError, asyncssh.Error: The host cannot be reached or closed the connection.
        """
        client = _PinningClient(pinned)
        try:
            conn, _ = await asyncio.wait_for(
                asyncssh.create_connection(
                    lambda: client,
                    endpoint.host,
                    endpoint.port,
                    username=endpoint.user,
                    client_keys=[str(k) if isinstance(k, Path) else k for k in endpoint.client_keys] or (),
                    known_hosts=asyncssh.import_known_hosts(""),
                    encryption_algs=list(CIPHERS),
                    keepalive_interval=15,
                    keepalive_count_max=3,
                ),
                time_limit,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            offered = client.seen.export_public_key().decode().strip() if client.seen else "unknown"
            raise HostKeyChangedError(
                f"the host key of {endpoint.host}:{endpoint.port} changed (pinned {fingerprint(pinned or '')}, "
                f"offered {fingerprint(offered) if client.seen else 'unknown'}). This may be an attack or a "
                "reinstalled machine; if you trust it, resume the run with --target to pin the new key"
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise _login_refused(endpoint) from exc
        assert client.seen is not None
        return cls(conn, client.seen.export_public_key().decode().strip())

    async def close(self) -> None:
        """Closes the connection."""
        self.conn.close()
        await self.conn.wait_closed()

    async def run(self, command: str, *, stdin: str | None = None, check: bool = True, time_limit: float = 300) -> str:
        """Runs a shell command and returns its stdout (without what the login shell printed before it).

        Raises:
            RemoteError: It exited non-zero (with ``check``).
        """
        marked = f"printf '%s\\n' {OUTPUT_MARKER}; {command}"
        result = await asyncio.wait_for(self.conn.run(marked, input=stdin, check=False), time_limit)
        if check and result.exit_status != 0:
            raise RemoteError(f"`{command[:200]}` failed ({result.exit_status}): {str(result.stderr)[-1500:]}")
        return command_output(str(result.stdout))

    async def sha256(self, remote: str) -> str | None:
        """SHA-256 of a remote file, or None when it does not exist."""
        quoted = shlex.quote(remote)
        out = await self.run(f"[ -f {quoted} ] && sha256sum {quoted} || true")
        return out.split()[0] if out.strip() else None

    async def upload(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        """Copies a file, continuing a partial copy, and verifies it by SHA-256 on the remote side."""
        digest = await asyncio.to_thread(sha256_file, local)
        if await self.sha256(remote) == digest:
            return
        await self.run(f"mkdir -p {shlex.quote(str(PurePosixPath(remote).parent))}")
        async with self.conn.start_sftp_client() as sftp:
            await self._upload_with(sftp, local, remote, progress)
        if await self.sha256(remote) != digest:
            await self.run(f"rm -f {shlex.quote(remote)}")
            raise RemoteError(f"upload of {local.name} did not verify (SHA-256 differs); it will be sent again")

    @staticmethod
    async def _upload_with(sftp: asyncssh.SFTPClient, local: Path, remote: str, progress: Progress | None) -> None:
        """The copy loop of :meth:`upload`: continues a shorter remote file, else writes it anew."""
        size = local.stat().st_size
        done = (await sftp.stat(remote)).size or 0 if await sftp.exists(remote) else 0
        done = done if done < size else 0
        async with sftp.open(remote, "ab" if done else "wb", max_requests=MAX_REQUESTS) as target:
            with local.open("rb") as source:
                source.seek(done)
                while block := source.read(CHUNK):
                    await target.write(block)
                    done += len(block)
                    if progress:
                        progress(local.name, done, size)

    async def download(
        self, remote: str, local: Path, expected_sha256: str | None = None, progress: Progress | None = None
    ) -> None:
        """Copies a remote file home, continuing a partial copy, verified by SHA-256."""
        expected = expected_sha256 or await self.sha256(remote)
        async with self.conn.start_sftp_client() as sftp:
            await self._download_with(sftp, remote, local, expected, progress)

    async def download_many(self, items: list[tuple[str, Path, str]], progress: Progress | None = None) -> None:
        """Downloads (remote, local, sha256) items over one SFTP session, each resumable and verified."""
        async with self.conn.start_sftp_client() as sftp:
            for remote, local, expected in items:
                await self._download_with(sftp, remote, local, expected, progress)

    async def _download_with(
        self, sftp: asyncssh.SFTPClient, remote: str, local: Path, expected: str | None, progress: Progress | None
    ) -> None:
        if local.exists() and expected and await asyncio.to_thread(sha256_file, local) == expected:
            return
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(local.name + ".part")
        size = (await sftp.stat(remote)).size or 0
        done = partial.stat().st_size if partial.exists() else 0
        done = 0 if done > size else done
        limits = getattr(sftp, "limits", None)
        block = int(getattr(limits, "max_read_len", 0) or 32768)  # the largest read the server answers whole
        async with sftp.open(remote, "rb") as source:
            with partial.open("ab" if done else "wb") as target:
                # Many server-sized reads in flight, written in order as they complete: as fast as sftp.get,
                # and every file is closed on every path (a dropped connection included).
                ahead = deque(
                    asyncio.ensure_future(source.read(block, offset))
                    for offset in range(done, min(size, done + READS_IN_FLIGHT * block), block)
                )
                next_offset = done + len(ahead) * block
                try:
                    while ahead:
                        data = cast(bytes, await ahead.popleft())
                        if next_offset < size:
                            ahead.append(asyncio.ensure_future(source.read(block, next_offset)))
                            next_offset += block
                        target.write(data)
                        done += len(data)
                        if progress:
                            progress(local.name, done, size)
                finally:
                    for pending in ahead:
                        pending.cancel()
        if expected and await asyncio.to_thread(sha256_file, partial) != expected:
            partial.unlink()
            raise RemoteError(f"download of {local.name} did not verify (SHA-256 differs); it will be fetched again")
        partial.replace(local)

    async def read_from(self, remote: str, offset: int, limit: int = READ_LIMIT) -> bytes | None:
        """At most ``limit`` bytes of a remote file after ``offset``; None when the file does not exist."""
        async with self.conn.start_sftp_client() as sftp:
            if not await sftp.exists(remote):
                return None
            async with sftp.open(remote, "rb") as handle:
                await handle.seek(offset)
                return cast(bytes, await handle.read(limit))


def command_output(stdout: str) -> str:
    """A command's own output: what follows the first output marker (all of it when there is none)."""
    _noise, marker, after = stdout.partition(OUTPUT_MARKER + "\n")
    return after if marker else stdout
