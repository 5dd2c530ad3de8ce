"""An SSH machine seen from the app: pinned host key, commands, resumable verified transfers (asyncssh).

Host keys are pinned on first contact (like OpenSSH's ``accept-new``) and verified on every later connection; a
changed key is refused. Secrets go over a channel's stdin, never on a command line.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, cast

import asyncssh

from desktop.services.machines.openssh_sftp import (
    OpenSshUnusableError,
    SftpLogin,
    copy_with_sftp,
    suits_openssh,
)
from desktop.services.platform.files import (
    BLOCK,
    HashingWriter,
    Segment,
    SegmentReader,
    open_hashing_writer,
    sha256_file,
    sha256_prefix,
)
from desktop.services.platform.logs import get_logger
from desktop.services.platform.programs import OpenSshTools, find_openssh

Progress = Callable[[str, int, int], None]
# Sends a file from ``start``: (sftp session, local, remote, progress, start=, on_segment=).
Sender = Callable[..., Awaitable[None]]
# SFTP writes in flight per upload: 16 of the server's 255 KiB requests are twice OpenSSH's 2 MiB channel window
# (and as many bytes as OpenSSH's sftp keeps in flight), so the link is never idle. More only queue in asyncssh's
# send buffer, and a window update then encrypts all of it in one callback: 128 in flight stalled the app 60 ms.
MAX_REQUESTS = 16
READS_IN_FLIGHT = 64
# An upload is verified per segment: the remote hashes one segment while the next is sent, so only the last
# segment's hash is waited for at the end.
SEGMENT = 64 << 20
# OpenSSL's SHA-256 uses the CPU's SHA extensions; coreutils' sha256sum often does not (8x slower here).
_REMOTE_SHA256 = "{ if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r; else sha256sum; fi; }"
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
_SEGMENT_MARKER = "__RENTUNE_SEGMENT__"
# Hashes the segments of an upload as they land: reading the file in place costs a third of the CPU of piping it
# through tail and head, which on a small machine is time taken from sshd receiving the upload.
_SEGMENT_HASHER = f"""
import hashlib, os, sys
for line in sys.stdin:
    offset, length = (int(part) for part in line.split())
    digest = hashlib.sha256()
    try:
        with open(sys.argv[1], "rb", buffering=0) as handle:
            while length > 0:
                data = os.pread(handle.fileno(), min(length, 1 << 20), offset)
                if not data:
                    break
                digest.update(data)
                offset, length = offset + len(data), length - len(data)
        answer = digest.hexdigest()
    except OSError:
        answer = "failed"
    sys.stdout.write("{_SEGMENT_MARKER} " + answer + "\\n")
    sys.stdout.flush()
"""
#: The interpreter the segment hasher runs on; without it the checks fall back to the shell loop.
SEGMENT_PYTHON = "python3"
#: The most bytes :meth:`RemoteMachine.read_from` returns at once (a hostile machine may offer endless data).
READ_LIMIT = 8 << 20
_log = get_logger("ssh")


#: Where a forwarded port listens here, and where it lands on the machine: never beyond either computer.
LOOPBACK = "127.0.0.1"


class HostKeyChangedError(ConnectionError):
    """The machine's host key is not the one pinned for this run."""


class RemoteError(RuntimeError):
    """Work on the machine failed: a copy that did not verify, a command cut off; the message says how."""


class CommandFailedError(RemoteError):
    """A command reached the machine and exited non-zero: the machine's answer, never a lost connection.

    Attributes:
        command: The command (never holds a secret: those travel on stdin).
        exit_status: Its exit status, 1 to 255.
        said: The machine's own words on one line: the end of its stderr (of its output, when stderr was empty).
    """

    def __init__(self, command: str, exit_status: int, said: str) -> None:
        self.command = command
        self.exit_status = exit_status
        self.said = one_line(said) or "no message"
        super().__init__(f"`{one_line(command)[:200]}` failed ({exit_status}): {self.said}")


class LoginRefusedError(asyncssh.PermissionDenied):
    """The machine refused every key offered; the message names the login and the keys."""


def is_refused_login(exc: BaseException) -> bool:
    """Whether a failure to connect is the machine refusing the login (it is up, and said no to the keys).

    Anything else met while connecting (refused, reset or timed-out TCP, no SSH banner yet, a dropped handshake)
    is a machine not reachable (yet).
    """
    return isinstance(exc, asyncssh.PermissionDenied)


def one_line(text: str, limit: int = 600) -> str:
    """``text`` with its whitespace runs (newlines too) made single spaces, cut to its last ``limit`` characters."""
    return " ".join(text.split())[-limit:]


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

    def __init__(self, conn: asyncssh.SSHClientConnection, host_key: str, endpoint: Endpoint | None = None) -> None:
        self.conn = conn
        self.host_key = host_key
        self.endpoint = endpoint
        self._openssh: OpenSshTools | None = find_openssh() if endpoint is not None else None

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
        return cls(conn, client.seen.export_public_key().decode().strip(), endpoint)

    async def close(self) -> None:
        """Closes the connection."""
        self.conn.close()
        await self.conn.wait_closed()

    async def forward_port(self, local_port: int, remote_port: int) -> asyncssh.SSHListener:
        """Forwards this computer's 127.0.0.1:``local_port`` (0: any free one) to the machine's 127.0.0.1 port."""
        return await self.conn.forward_local_port(LOOPBACK, local_port, LOOPBACK, remote_port)

    async def run(self, command: str, *, stdin: str | None = None, check: bool = True, time_limit: float = 300) -> str:
        """Runs a shell command and returns its stdout (without what the login shell printed before it).

        Raises:
            CommandFailedError: It exited non-zero (with ``check``): the machine's answer.
            RemoteError: It ended without an exit status (killed by a signal, or its channel closed).
        """
        marked = f"printf '%s\\n' {OUTPUT_MARKER}; {command}"
        result = await asyncio.wait_for(self.conn.run(marked, input=stdin, check=False), time_limit)
        output = command_output(str(result.stdout))
        status = result.exit_status
        if check and (status is None or status < 0):
            killed_by = result.exit_signal[0] if result.exit_signal else "none"
            raise RemoteError(f"`{one_line(command)[:200]}` ended without an exit status (signal: {killed_by})")
        if check and status:
            raise CommandFailedError(command, status, str(result.stderr or "") or output)
        return output

    async def sha256(self, remote: str) -> str | None:
        """SHA-256 of a remote file, or None when it does not exist."""
        quoted = shlex.quote(remote)
        return _digest_in(await self.run(f"[ -f {quoted} ] && {_REMOTE_SHA256} < {quoted} || true"))

    async def _sha256_range(self, remote: str, offset: int, length: int) -> str | None:
        """SHA-256 of ``length`` bytes of a remote file from ``offset`` (fewer when the file is shorter)."""
        quoted = shlex.quote(remote)
        return _digest_in(await self.run(f"tail -c +{offset + 1} {quoted} | head -c {length} | {_REMOTE_SHA256}"))

    async def upload(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        """Copies a file, continuing a partial copy, verified by SHA-256 on the remote side.

        The file is hashed as it is sent, and the remote hashes each segment as soon as it has landed, while the next
        one is sent. A remote file of the same size is only hashed, never sent again. Large files go through
        OpenSSH's own ``sftp`` where it is installed (see :mod:`desktop.services.machines.openssh_sftp`); asyncssh
        copies the rest, and whatever ``sftp`` cannot log in for.

        Raises:
            RemoteError: The remote copy does not verify (it is deleted, so the next attempt sends it anew).
        """
        size = local.stat().st_size
        tools = self._openssh if suits_openssh(local, remote, size) else None
        if tools is not None:
            try:
                await self._upload_once(local, remote, size, progress, partial(self._send_with_openssh, tools))
                return
            except OpenSshUnusableError as exc:
                _log.warning("sftp cannot log in (%s); %s goes through the built-in client", exc, local.name)
                self._openssh = None
        await self._upload_once(local, remote, size, progress, self._upload_with)

    async def _upload_once(self, local: Path, remote: str, size: int, progress: Progress | None, send: Sender) -> None:
        """One verified upload with ``send`` doing the copying (see :meth:`upload`)."""
        async with self.conn.start_sftp_client() as sftp:
            start = await self._upload_start(sftp, local, remote, size)
            if start is None:
                return
            checks = _SegmentChecks(self, remote)
            try:
                await send(sftp, local, remote, progress, start=start, on_segment=checks.start)
                verified = await checks.all_match() and (await sftp.stat(remote)).size == size
            finally:
                await checks.close()
        if not verified:
            await self.run(f"rm -f {shlex.quote(remote)}")
            raise RemoteError(f"upload of {local.name} did not verify (SHA-256 differs); it will be sent again")

    async def _send_with_openssh(
        self,
        tools: OpenSshTools,
        sftp: asyncssh.SFTPClient,
        local: Path,
        remote: str,
        progress: Progress | None,
        *,
        start: int,
        on_segment: Callable[[Segment], None],
    ) -> None:
        """The copy of :meth:`upload` by OpenSSH's ``sftp``, logged in with this connection's keys and host key."""
        assert self.endpoint is not None  # tools are only found for a machine that knows its endpoint
        size = await asyncio.to_thread(os.path.getsize, local)
        async with SftpLogin(tools, self.endpoint, self.host_key) as login:
            await copy_with_sftp(
                login,
                sftp,
                local,
                remote,
                start=start,
                size=size,
                segment=SEGMENT,
                progress=progress,
                on_segment=on_segment,
            )

    async def _upload_start(self, sftp: asyncssh.SFTPClient, local: Path, remote: str, size: int) -> int | None:
        """Where the upload starts: None when the remote copy is complete, its size when it is a true prefix, else 0.

        Sizes are compared first; only a remote file that could be the whole or a part is hashed (on both ends at
        once), so a fresh upload reads the local file only while sending it.
        """
        try:
            have = (await sftp.stat(remote)).size or 0
        except asyncssh.SFTPNoSuchFile:
            await sftp.makedirs(str(PurePosixPath(remote).parent), exist_ok=True)
            return 0
        if have > size or (not have and size):
            return 0
        local_digest, remote_digest = await asyncio.gather(
            asyncio.to_thread(sha256_prefix, local, have), self._sha256_range(remote, 0, have)
        )
        if local_digest != remote_digest:
            return 0
        return None if have == size else have

    @staticmethod
    async def _upload_with(
        sftp: asyncssh.SFTPClient,
        local: Path,
        remote: str,
        progress: Progress | None,
        *,
        start: int = 0,
        on_segment: Callable[[Segment], None] | None = None,
    ) -> None:
        """The copy loop of :meth:`upload`: sends the file from ``start`` (keeping the remote bytes before it).

        A worker thread reads (and, with ``on_segment``, hashes) the next block while the loop sends this one as
        parallel SFTP writes; ``on_segment`` gets each segment once all of its bytes have landed.
        """
        size = local.stat().st_size
        request = sftp.limits.max_write_len or 32768
        loop = asyncio.get_running_loop()
        async with sftp.open(remote, "r+b" if start else "wb", block_size=request) as target:
            with local.open("rb", buffering=0) as handle:
                reader = SegmentReader(handle, start, size, SEGMENT if on_segment else None)
                window = _WriteWindow(target, request, start)
                ahead = loop.run_in_executor(None, reader.read)
                try:
                    while (block := await ahead) is not None:
                        ahead = loop.run_in_executor(None, reader.read)
                        offset, data, segment = block
                        await window.write(data, offset)
                        if segment is not None and on_segment is not None:
                            window.when_landed(segment.offset + segment.length, partial(on_segment, segment))
                        if progress:
                            progress(local.name, window.landed, size)
                    await window.drain()
                finally:
                    await _settled(ahead)  # the worker thread is done with the file before it is closed
                    await window.close()
        if progress:
            progress(local.name, size, size)

    async def download(
        self, remote: str, local: Path, expected_sha256: str | None = None, progress: Progress | None = None
    ) -> None:
        """Copies a remote file home, continuing a partial copy, verified by SHA-256.

        Without ``expected_sha256`` the remote hashes its file while it is being copied (first, when a local copy
        exists that may already be complete).

        Raises:
            RemoteError: The copy does not verify (it is deleted, so the next attempt fetches it anew).
        """
        expected = expected_sha256
        if expected is None and local.exists():
            expected = await self.sha256(remote)
        async with self.conn.start_sftp_client() as sftp:
            if expected is not None:
                await self._download_with(sftp, remote, local, expected, progress)
                return
            theirs = asyncio.ensure_future(self.sha256(remote))
            try:
                partial, ours = await self._copy_home(sftp, remote, local, progress)
            except BaseException:
                theirs.cancel()
                await _settled(theirs)
                raise
        _keep_if_verified(partial, local, ours, await theirs or "")  # no digest from the remote: nothing verifies

    async def download_many(self, items: list[tuple[str, Path, str]], progress: Progress | None = None) -> None:
        """Downloads (remote, local, sha256) items over one SFTP session, each resumable and verified."""
        async with self.conn.start_sftp_client() as sftp:
            for remote, local, expected in items:
                await self._download_with(sftp, remote, local, expected, progress)

    async def _download_with(
        self, sftp: asyncssh.SFTPClient, remote: str, local: Path, expected: str | None, progress: Progress | None
    ) -> None:
        """Brings ``remote`` home unless ``local`` already has ``expected``; with ``expected`` None, unverified.

        Raises:
            RemoteError: The copy differs from ``expected`` (it is deleted).
        """
        if local.exists() and expected and await asyncio.to_thread(sha256_file, local) == expected:
            return
        partial, digest = await self._copy_home(sftp, remote, local, progress)
        _keep_if_verified(partial, local, digest, expected)

    async def _copy_home(
        self, sftp: asyncssh.SFTPClient, remote: str, local: Path, progress: Progress | None
    ) -> tuple[Path, str]:
        """Copies into ``local``.part (continuing it), hashing while writing; returns it and the copy's SHA-256."""
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(local.name + ".part")
        size = (await sftp.stat(remote)).size or 0
        done = partial.stat().st_size if partial.exists() else 0
        done = 0 if done > size else done
        writer = await open_hashing_writer(partial, done)
        try:
            await self._fetch_into(sftp, remote, writer, done=done, size=size, name=local.name, progress=progress)
        finally:
            digest = await asyncio.to_thread(writer.close)
        return partial, digest

    @staticmethod
    async def _fetch_into(
        sftp: asyncssh.SFTPClient,
        remote: str,
        writer: HashingWriter,
        *,
        done: int,
        size: int,
        name: str,
        progress: Progress | None,
    ) -> None:
        """Reads ``remote`` from ``done`` with many server-sized reads in flight; a worker thread writes and hashes.

        Reads are taken in order as they complete (as fast as sftp.get) and handed to the thread in 1 MiB batches,
        one batch at a time, so the loop never waits on the disk; every file is closed on every path.
        """
        limits = getattr(sftp, "limits", None)
        block = int(getattr(limits, "max_read_len", 0) or 32768)  # the largest read the server answers whole
        loop = asyncio.get_running_loop()
        async with sftp.open(remote, "rb") as source:
            ahead = deque(
                asyncio.ensure_future(source.read(block, offset))
                for offset in range(done, min(size, done + READS_IN_FLIGHT * block), block)
            )
            next_offset = done + len(ahead) * block
            batch: list[bytes] = []
            writing: asyncio.Future[None] = loop.create_future()
            writing.set_result(None)
            try:
                while ahead:
                    data = cast(bytes, await ahead.popleft())
                    if next_offset < size:
                        ahead.append(asyncio.ensure_future(source.read(block, next_offset)))
                        next_offset += block
                    batch.append(data)
                    done += len(data)
                    if len(batch) * block >= BLOCK or not ahead:
                        await writing  # one batch at a time keeps the file in order
                        writing, batch = loop.run_in_executor(None, writer.write, batch), []
                        if progress:
                            progress(name, done, size)
                await writing
            finally:
                for pending in ahead:
                    pending.cancel()
                await _settled(writing)

    async def read_from(self, remote: str, offset: int, limit: int = READ_LIMIT) -> bytes | None:
        """At most ``limit`` bytes of a remote file after ``offset``; None when the file does not exist."""
        async with self.conn.start_sftp_client() as sftp:
            if not await sftp.exists(remote):
                return None
            async with sftp.open(remote, "rb") as handle:
                await handle.seek(offset)
                return cast(bytes, await handle.read(limit))


def _keep_if_verified(partial: Path, local: Path, digest: str, expected: str | None) -> None:
    """Gives a finished copy its name, or deletes it when its digest is not ``expected`` (None: not checked).

    Raises:
        RemoteError: The digests differ.
    """
    if expected is not None and digest != expected:
        partial.unlink()
        raise RemoteError(f"download of {local.name} did not verify (SHA-256 differs); it will be fetched again")
    partial.replace(local)


def _digest_in(output: str) -> str | None:
    """The hex digest that starts a hasher's output, or None (a rented machine is untrusted: nothing else counts)."""
    first = output.split(maxsplit=1)[0].lower() if output.strip() else ""
    return first if re.fullmatch(r"[0-9a-f]{64}", first) else None


class _WriteWindow:
    """The SFTP writes of one file: up to MAX_REQUESTS in flight, acknowledged (landed) in order."""

    def __init__(self, target: asyncssh.SFTPClientFile, request: int, start: int) -> None:
        self._target = target
        self._request = request
        self._ahead: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._waiting: deque[tuple[int, Callable[[], None]]] = deque()
        self.landed = start  # every byte before this offset is written

    async def write(self, data: bytes, offset: int) -> None:
        """Sends ``data`` as requests of the server's size, waiting for the oldest while the window is full."""
        view = memoryview(data)
        for start in range(0, len(view), self._request):
            while len(self._ahead) >= MAX_REQUESTS:
                await self._land_oldest()
            piece = view[start : start + self._request]
            # asyncssh only concatenates the data into its packet: a view saves copying every byte once more.
            sent = asyncio.ensure_future(self._target.write(cast(bytes, piece), offset + start))
            self._ahead.append((offset + start + len(piece), sent))

    def when_landed(self, offset: int, callback: Callable[[], None]) -> None:
        """Calls ``callback`` once every byte before ``offset`` has landed."""
        self._waiting.append((offset, callback))
        self._fire()

    async def drain(self) -> None:
        """Waits until every write has landed."""
        while self._ahead:
            await self._land_oldest()

    async def close(self) -> None:
        """Cancels the writes still in flight (after an error) and collects their outcomes."""
        for _, sent in self._ahead:
            sent.cancel()
        await asyncio.gather(*(sent for _, sent in self._ahead), return_exceptions=True)
        self._ahead.clear()

    async def _land_oldest(self) -> None:
        end, sent = self._ahead[0]
        await sent
        self._ahead.popleft()
        self.landed = end
        self._fire()

    def _fire(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.landed:
            self._waiting.popleft()[1]()


class _SegmentChecks:
    """Remote SHA-256 checks of the segments of one upload, each started as soon as its segment has landed.

    One remote process hashes the segments it is told, one line per segment, so a check costs no new SSH channel:
    Python when the machine has ``python3`` (it reads the file in place), else a shell loop of tail, head and a hasher.
    """

    def __init__(self, machine: RemoteMachine, remote: str) -> None:
        quoted = shlex.quote(remote)
        # Each answer starts with a marker: a login shell's greeting (a chatty .bashrc) is not an answer.
        script = (
            f"while read -r offset length; do printf '%s ' {_SEGMENT_MARKER}; "
            f'tail -c +$((offset + 1)) {quoted} | head -c "$length" | {_REMOTE_SHA256} || echo failed; done'
        )
        python = shlex.quote(SEGMENT_PYTHON)
        hasher = f"exec {python} -c {shlex.quote(_SEGMENT_HASHER)} {quoted}"
        command = f"if command -v {python} >/dev/null 2>&1; then {hasher}; else exec sh -c {shlex.quote(script)}; fi"
        self._shell = asyncio.ensure_future(machine.conn.create_process(command))
        self._gate = asyncio.Lock()  # one segment at a time: each answer is the next line
        self._checks: list[asyncio.Future[bool]] = []

    def start(self, segment: Segment) -> None:
        """Starts checking one landed segment."""
        self._checks.append(asyncio.ensure_future(self._matches(segment)))

    async def all_match(self) -> bool:
        """Whether every segment started so far matches its digest on the remote side."""
        return all(await asyncio.gather(*self._checks))

    async def close(self) -> None:
        """Cancels the checks still running (after an error), collects their outcomes and ends the remote shell."""
        for check in self._checks:
            check.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        await _settled(self._shell)
        if not self._shell.cancelled() and self._shell.exception() is None:
            self._shell.result().close()

    async def _matches(self, segment: Segment) -> bool:
        shell = await asyncio.shield(self._shell)
        async with self._gate:
            shell.stdin.write(f"{segment.offset} {segment.length}\n")
            while line := await shell.stdout.readline():
                if line.startswith(f"{_SEGMENT_MARKER} "):
                    return _digest_in(line.removeprefix(f"{_SEGMENT_MARKER} ")) == segment.sha256
            return False


async def _settled(future: asyncio.Future[Any]) -> None:
    """Waits for a worker-thread future without raising its error (the error being handled is another one)."""
    await asyncio.wait([future])
    if not future.cancelled():
        future.exception()


def command_output(stdout: str) -> str:
    """A command's own output: what follows the first output marker (all of it when there is none)."""
    _noise, marker, after = stdout.partition(OUTPUT_MARKER + "\n")
    return after if marker else stdout
