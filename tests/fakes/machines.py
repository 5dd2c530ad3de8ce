"""Machines the fake clouds rent out: each one a private OpenSSH sshd on 127.0.0.1 with its own port, host key and
home folder, whose ``~/.ssh/authorized_keys`` holds the key the client handed to the provider.

Stopping a machine really takes it away: its sshd and every process started through it are killed (they carry a
marker variable set with sshd's ``SetEnv``, inherited even by ``setsid nohup`` children, found in /proc/*/environ).
"""

from __future__ import annotations

import getpass
import os
import secrets
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.sshd import SshServer

MARKER_VAR = "RENTUNE_FAKE_MACHINE"


@dataclass(frozen=True)
class MachineAddress:
    """Where a fake machine listens and who logs in.

    Attributes:
        host: 127.0.0.1.
        port: Its sshd's port.
        user: The login user (the user running the tests).
        host_public_key: Its host key (``ssh-ed25519 AAAA...``).
        home: Its home folder (the machine's "disk").
    """

    host: str
    port: int
    user: str
    host_public_key: str
    home: Path


class MachinePool:
    """Starts and kills fake machines under ``root``, one folder each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: dict[str, SshServer] = {}
        self._lock = threading.Lock()
        # Machine ids repeat across fakes (every fake counts from 1001): the marker adds this pool's own token, so
        # killing a machine never reaches another test's machine in a parallel worker.
        self.token = secrets.token_hex(6)

    def marker(self, machine_id: str) -> str:
        """The marker value the machine's processes carry."""
        return f"{self.token}-{machine_id}"

    def start(self, machine_id: str, public_key: str, env: dict[str, str] | None = None) -> MachineAddress:
        """Boots a new machine that lets ``public_key`` in; ``env`` is set in every session (like a pod's env)."""
        directory = self.root / machine_id
        home = directory / "home"
        (home / ".ssh").mkdir(parents=True, exist_ok=True)
        server = SshServer(directory)
        server.authorized_keys_file = home / ".ssh" / "authorized_keys"
        server.authorized_keys_file.write_text(public_key.strip() + "\n")
        variables = {"HOME": str(home), MARKER_VAR: self.marker(machine_id), **(env or {})}
        server.extra_config = [f"SetEnv {' '.join(f'{k}={v}' for k, v in variables.items())}"]
        server.start()
        with self._lock:
            self.servers[machine_id] = server
        return MachineAddress("127.0.0.1", server.port, getpass.getuser(), server.host_public_key, home)

    def kill(self, machine_id: str) -> None:
        """Takes the machine away: its sshd, its sessions and every process started through it."""
        with self._lock:
            server = self.servers.pop(machine_id, None)
        if server is not None:
            server.stop()
        for pid in processes_of(self.marker(machine_id)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue

    def kill_all(self) -> None:
        """Kills every machine still up (end of a test)."""
        for machine_id in list(self.servers):
            self.kill(machine_id)

    def alive(self, machine_id: str) -> bool:
        """Whether the machine's sshd still runs."""
        server = self.servers.get(machine_id)
        return server is not None and server.process is not None and server.process.poll() is None


def processes_of(marker_value: str) -> list[int]:
    """PIDs of processes whose environment carries the marker (:meth:`MachinePool.marker`)."""
    marker = f"{MARKER_VAR}={marker_value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
