"""Large uploads through OpenSSH's own ``sftp`` program: C-speed encryption, off the app's event loop.

asyncssh builds every SSH packet in Python: it spends about twice OpenSSH's CPU per byte sent, and it does so on the
app's event loop. On a small computer that CPU is what limits an upload (and what the interface waits for), so for
large files :class:`~desktop.services.machines.ssh.RemoteMachine` hands the copy to ``sftp``, as Ansible and SkyPilot
do, with the same guarantees as its own client:

- Only the pinned host key is accepted: a known_hosts file holding just that key, ``StrictHostKeyChecking=yes``.
- The run's private key never touches the disk: a private ``ssh-agent`` is given it on stdin for the copy, and only
  its public half is written (``IdentitiesOnly`` then takes the private half from that agent). Nothing secret is on
  a command line.
- The copy is checked segment by segment on the remote side while it runs: ``sftp`` writes in order with a bounded
  number of requests in flight, so every byte below the remote size minus :data:`LANDED_LAG` has landed.

Where there is no ``sftp``/``ssh-agent``/``ssh-add`` (or on Windows, whose agent is a named pipe), for small files,
for paths ``sftp``'s batch syntax cannot carry, or with ``RENTUNE_TRANSFER=builtin``, asyncssh does the copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import asyncssh

from desktop.services.platform.files import BLOCK, Segment, SegmentReader
from desktop.services.platform.programs import OpenSshTools

if TYPE_CHECKING:
    from desktop.services.machines.ssh import Endpoint

#: Files smaller than this go through asyncssh: starting an agent and a second login costs more than it saves.
OPENSSH_MIN_BYTES = 16 << 20
# 16 requests of 255 KiB (the largest OpenSSH's sftp-server takes) in flight: as many bytes as its channel window.
_REQUEST_BYTES = 255 << 10
_REQUESTS = 16
#: Every byte below the remote file's size minus this has landed (twice what sftp can have in flight).
LANDED_LAG = 2 * _REQUESTS * _REQUEST_BYTES
_POLL_S = 0.2
#: How often a key is offered to an agent whose socket is there but not listening yet (50 ms apart).
_AGENT_READY_TRIES = 40
_KEY_LIFETIME_S = 120
_HOST_ALIAS = "rentune-pinned-host"
# sftp's batch parser treats these specially (quotes, escapes, globs, options): such paths go through asyncssh.
_UNSAFE_CHARACTERS = frozenset('"\\*?[]\n\r')
_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes256-ctr"
Progress = Callable[[str, int, int], None]


class OpenSshUnusableError(RuntimeError):
    """OpenSSH's sftp could not connect or log in (the caller copies with asyncssh instead)."""


def suits_openssh(local: Path, remote: str, size: int) -> bool:
    """Whether a copy is worth handing to sftp: large enough, and both paths plain enough for its batch syntax."""
    names = (str(local.resolve()), remote)
    return size >= OPENSSH_MIN_BYTES and not any(
        name.startswith("-") or _UNSAFE_CHARACTERS & set(name) for name in names
    )


def host_key_algorithms(host_key: str) -> str:
    """The algorithms that make the server show its pinned key (an RSA key is signed with SHA-2 where it can)."""
    kind = host_key.split(maxsplit=1)[0]
    return "rsa-sha2-512,rsa-sha2-256,ssh-rsa" if kind == "ssh-rsa" else kind


class SftpLogin:
    """A private folder with the pinned host key and the keys' public halves, and an agent holding the private ones.

    Use as ``async with SftpLogin(tools, endpoint, host_key) as login:``; leaving stops the agent and deletes the
    folder.
    """

    def __init__(self, tools: OpenSshTools, endpoint: Endpoint, host_key: str) -> None:
        self.tools = tools
        self.endpoint = endpoint
        self.host_key = host_key
        self.folder = Path()
        self._identities: list[str] = []
        self._socket: Path | None = None
        self._agent: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> SftpLogin:
        self.folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="rentune-sftp-"))
        try:
            in_agent = await asyncio.to_thread(self._write_public_files)
            if in_agent:
                await self._start_agent(in_agent)
        except BaseException:
            await self._clean_up()
            raise
        return self

    def _write_public_files(self) -> list[asyncssh.SSHKey]:
        """Writes the pinned host key and each in-memory key's public half; returns the keys the agent must hold."""
        (self.folder / "known_hosts").write_text(f"{_HOST_ALIAS} {self.host_key}\n", encoding="utf-8")
        in_agent: list[asyncssh.SSHKey] = []
        for key in self.endpoint.client_keys:
            if isinstance(key, Path):
                self._identities.append(str(key))
                continue
            public = self.folder / f"key-{len(in_agent)}.pub"
            public.write_bytes(key.export_public_key())
            self._identities.append(str(public))
            in_agent.append(key)
        return in_agent

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self._clean_up()

    def command(self) -> list[str]:
        """The ``sftp`` command line (batch commands come on its stdin); it holds nothing secret."""
        endpoint = self.endpoint
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        options = [
            "BatchMode=yes",
            "IdentitiesOnly=yes",
            f"IdentityAgent={self._socket or 'none'}",
            f"UserKnownHostsFile={self.folder / 'known_hosts'}",
            f"GlobalKnownHostsFile={os.devnull}",
            "StrictHostKeyChecking=yes",
            f"HostKeyAlias={_HOST_ALIAS}",
            f"HostKeyAlgorithms={host_key_algorithms(self.host_key)}",
            "CheckHostIP=no",
            "UpdateHostKeys=no",
            f"Ciphers={_CIPHERS}",
            "ConnectTimeout=20",
            "ServerAliveInterval=15",
            "ServerAliveCountMax=3",
            "LogLevel=ERROR",
        ]
        # A lower priority keeps the window responsive when the copy has all the CPU (it never slows a copy that
        # waits on the network).
        niced = [self.tools.nice, "-n", "10"] if self.tools.nice else []
        command = [*niced, self.tools.sftp, "-b", "-", "-F", os.devnull, "-P", str(endpoint.port)]
        command += ["-B", str(_REQUEST_BYTES), "-R", str(_REQUESTS)]
        for option in options:
            command += ["-o", option]
        for identity in self._identities:
            command += ["-i", identity]
        return [*command, f"{endpoint.user}@{host}"]

    async def _start_agent(self, keys: list[asyncssh.SSHKey]) -> None:
        """Starts a private agent and gives it the keys on stdin.

        Raises:
            OpenSshUnusableError: The agent did not start or refused a key.
        """
        self._socket = self.folder / "agent"
        self._agent = await asyncio.create_subprocess_exec(
            self.tools.agent,
            "-D",
            "-a",
            str(self._socket),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for _ in range(500):
            if self._socket.exists() or self._agent.returncode is not None:
                break
            await asyncio.sleep(0.01)
        if not self._socket.exists():
            raise OpenSshUnusableError("ssh-agent did not start")
        environment = {**os.environ, "SSH_AUTH_SOCK": str(self._socket)}
        for key in keys:
            await self._add_key(key, environment)

    async def _add_key(self, key: asyncssh.SSHKey, environment: dict[str, str]) -> None:
        """Gives the agent one key; retried while the agent's socket exists but it does not listen yet.

        ssh-agent creates its socket file before it listens on it: an ``ssh-add`` in between is refused ("Error
        connecting to agent: Connection refused"), which a loaded machine hit now and then.
        """
        for attempt in range(_AGENT_READY_TRIES):
            adding = await asyncio.create_subprocess_exec(
                self.tools.add,
                "-q",
                "-t",  # sftp needs the key only to log in: should this app die mid-copy, the agent forgets it
                str(_KEY_LIFETIME_S),
                "-",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=environment,
            )
            _, error = await adding.communicate(key.export_private_key())
            if adding.returncode == 0:
                return
            words = error.decode(errors="replace").strip()
            agent_up = self._agent is not None and self._agent.returncode is None
            if "Error connecting to agent" not in words or not agent_up or attempt == _AGENT_READY_TRIES - 1:
                raise OpenSshUnusableError(f"ssh-add refused the run key: {words}")
            await asyncio.sleep(0.05)

    async def _clean_up(self) -> None:
        if self._agent is not None and self._agent.returncode is None:
            self._agent.kill()
            await self._agent.wait()
        await asyncio.to_thread(shutil.rmtree, self.folder, True)


class Pace:
    """Keeps a hashing thread at most ``ahead`` bytes past what has landed, so that it reads what sftp reads.

    Both then read the same stretch of the file within moments of each other, from the page cache: the disk is read
    once, even for a file larger than memory.
    """

    def __init__(self, start: int, ahead: int) -> None:
        self.ahead = ahead
        self._limit = start + ahead
        self._stopped = False
        self._changed = threading.Condition()

    def allow(self, landed: int) -> None:
        """Lets the thread read up to ``ahead`` bytes past ``landed``."""
        with self._changed:
            self._limit = max(self._limit, landed + self.ahead)
            self._changed.notify_all()

    def stop(self) -> None:
        """Releases the thread for good (the copy has ended, one way or another)."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def wait_until_allowed(self, end: int) -> bool:
        """Blocks until reading up to ``end`` is allowed; False when stopped."""
        with self._changed:
            while end > self._limit and not self._stopped:
                self._changed.wait()
            return not self._stopped


def hash_segments(
    local: Path, start: int, end: int, *, segment: int, pace: Pace, deliver: Callable[[Segment], None]
) -> None:
    """Hashes ``local`` from ``start`` to ``end`` in segments as :class:`SegmentReader` cuts them, at ``pace``.

    ``deliver`` gets each segment with its digest as soon as it is hashed (it is called on this worker thread).
    """
    with local.open("rb", buffering=0) as handle:
        reader = SegmentReader(handle, start, end, segment)
        offset = start
        while pace.wait_until_allowed(min(end, offset + BLOCK)) and (block := reader.read()) is not None:
            offset = block[0] + len(block[1])
            if block[2] is not None:
                deliver(block[2])


def batch_line(local: Path, remote: str, *, resume: bool) -> bytes:
    """The sftp batch command that sends ``local`` (``reput`` continues a remote prefix)."""
    verb = "reput" if resume else "put"
    return f'{verb} "{local.resolve()}" "{remote}"\n'.encode()


async def copy_with_sftp(
    login: SftpLogin,
    client: asyncssh.SFTPClient,
    local: Path,
    remote: str,
    *,
    start: int,
    size: int,
    segment: int,
    progress: Progress | None = None,
    on_segment: Callable[[Segment], None] | None = None,
) -> None:
    """Sends ``local`` (``size`` bytes) from ``start`` with ``sftp``, hashing it meanwhile in a worker thread.

    ``client`` (the app's own SFTP session) watches the remote size, which says what has landed: progress reports
    it, and ``on_segment`` gets each segment (with its local digest) once it has landed.

    Raises:
        OpenSshUnusableError: sftp could not connect or log in (exit 255 before anything was sent).
        RemoteError: sftp failed while copying (its own words).
    """
    if not start:  # a stale remote file's size would read as landed bytes
        with contextlib.suppress(OSError, asyncssh.SFTPError):
            await client.remove(remote)
    loop = asyncio.get_running_loop()
    pace = Pace(start, segment + LANDED_LAG)
    landing = _Landing(local.name, start, size, progress=progress, on_segment=on_segment, pace=pace)

    def deliver(segment: Segment) -> None:  # called on the hashing thread: the landing lives on the loop
        loop.call_soon_threadsafe(landing.add, segment)

    digests = asyncio.ensure_future(
        asyncio.to_thread(hash_segments, local, start, size, segment=segment, pace=pace, deliver=deliver)
    )
    process = await asyncio.create_subprocess_exec(
        *login.command(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    finished = asyncio.ensure_future(process.communicate(batch_line(local, remote, resume=bool(start))))
    try:
        while not (await asyncio.wait({finished}, timeout=_POLL_S))[0]:
            landing.advance(await _remote_size(client, remote) - LANDED_LAG)
        _, error = finished.result()
        _raise_for(process.returncode, error.decode(errors="replace"), local.name, landing.landed > start)
        landing.advance(size)
        await digests  # its last segments are handed on before it completes
    finally:
        pace.stop()
        if process.returncode is None:
            process.kill()
        await asyncio.wait({finished, digests})
        for future in (finished, digests):
            if not future.cancelled():
                future.exception()


class _Landing:
    """What has landed of one copy: reports progress, paces the hashing, and hands on each segment once landed."""

    def __init__(
        self,
        name: str,
        start: int,
        size: int,
        *,
        progress: Progress | None,
        on_segment: Callable[[Segment], None] | None,
        pace: Pace,
    ) -> None:
        self.name, self.size, self.landed = name, size, start
        self._progress, self._on_segment, self._pace = progress, on_segment, pace
        self._waiting: deque[Segment] = deque()

    def add(self, segment: Segment) -> None:
        """Takes a segment's local digest; hands it on at once if it has landed."""
        self._waiting.append(segment)
        self._hand_on()

    def advance(self, landed: int) -> None:
        """Every byte before ``landed`` is known to be on the remote disk."""
        if landed <= self.landed:
            return
        self.landed = min(landed, self.size)
        self._pace.allow(self.landed)
        if self._progress:
            self._progress(self.name, self.landed, self.size)
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiting and self._waiting[0].offset + self._waiting[0].length <= self.landed:
            segment = self._waiting.popleft()
            if self._on_segment is not None:
                self._on_segment(segment)


async def _remote_size(client: asyncssh.SFTPClient, remote: str) -> int:
    try:
        return int((await client.stat(remote)).size or 0)
    except asyncssh.SFTPError:
        return 0


def _raise_for(code: int | None, error: str, name: str, sent_some: bool) -> None:
    """Turns sftp's exit into an outcome: 0 is success, 255 before any byte landed is an unusable login."""
    from desktop.services.machines.ssh import RemoteError  # here: ssh_remote imports this module

    if code == 0:
        return
    said = " ".join(error.split())[-1500:] or f"exit status {code}"
    if code == 255 and not sent_some:
        raise OpenSshUnusableError(said)
    raise RemoteError(f"sftp could not copy {name} ({said})")
