"""What a run needs from a training machine: the :class:`Machine` protocol, and :data:`Connect`, how one is reached.

:class:`~desktop.services.machines.ssh.RemoteMachine` is the real one (SSH); tests drive the run engine through a
fake that keeps its files in memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from desktop.services.machines.ssh import Endpoint

#: Called with (file name, bytes done, bytes in all) while a file travels.
Progress = Callable[[str, int, int], None]


class Machine(Protocol):
    """One open connection to a training machine."""

    @property
    def host_key(self) -> str:
        """The machine's public host key, OpenSSH format."""
        ...

    async def run(self, command: str, *, stdin: str | None = None, check: bool = True, time_limit: float = 300) -> str:
        """Runs a shell command and returns its stdout.

        Raises:
            RemoteError: It exited non-zero (with ``check``).
        """
        ...

    async def upload(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        """Copies a file to the machine, verified."""
        ...

    async def download(
        self, remote: str, local: Path, expected_sha256: str | None = None, progress: Progress | None = None
    ) -> None:
        """Copies a file home, verified by SHA-256."""
        ...

    async def download_many(self, items: list[tuple[str, Path, str]], progress: Progress | None = None) -> None:
        """Copies (remote, local, sha256) files home, each verified."""
        ...

    async def read_from(self, remote: str, offset: int, limit: int = ...) -> bytes | None:
        """At most ``limit`` bytes of a file after ``offset``; None when the file does not exist."""
        ...

    async def forward_port(self, local_port: int, remote_port: int) -> PortForward:
        """Forwards this computer's 127.0.0.1:``local_port`` (0: any free one) to the machine's own 127.0.0.1 port.

        Each connection is carried over the machine's connection; nothing listens beyond either computer.
        """
        ...

    async def close(self) -> None:
        """Closes the connection."""
        ...


class PortForward(Protocol):
    """A local port forwarded to the machine; it ends with :meth:`close` or with the connection."""

    def get_port(self) -> int:
        """The local port it listens on."""
        ...

    def close(self) -> None:
        """Stops listening (connections open now are closed with it)."""
        ...


#: Logs in to a machine: (endpoint, pinned host key or None to accept the one presented, seconds allowed).
Connect = Callable[[Endpoint, str | None, float], Awaitable[Machine]]
