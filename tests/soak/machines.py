"""The soak's machines: in-memory hosts whose trainer finishes after a while, found by port, with the transfers that
move to and from each (Rentune must never take a machine away while one moves)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from desktop.services.machines.ssh import Endpoint
from desktop.services.providers.base import ProviderName
from tests.fakes.http import FakeCloud
from tests.fakes.machines import MachineAddress
from tests.fixtures.fake_machine import FakeHost
from trainer_payload.protocol import EventKind


class MachineRoom:
    """Every in-memory machine of a schedule, found by port, with the transfers that move to and from each.

    A machine's trainer finishes (a checkpoint, then the adapter) a random time after it is launched. A killed machine
    refuses new connections. Rentune terminating a machine while a transfer to or from it moves (one of a process
    still alive) is recorded as a violation; the provider taking one away (outbid, preempted, lost) is not.
    """

    def __init__(
        self, rng: random.Random, violations: list[str], trainer_seconds: tuple[float, float] = (0.3, 2.0)
    ) -> None:
        self.rng, self.violations, self.trainer_seconds = rng, violations, trainer_seconds
        self.hosts: dict[int, FakeHost] = {}
        self.dead: set[int] = set()
        self.transfers: dict[tuple[int, str], int] = {}
        self.lock = threading.Lock()
        self._ports = iter(range(41000, 60000))

    def new_host(self) -> int:
        """A new machine; returns its port."""
        with self.lock:
            port = next(self._ports)
            host = FakeHost()
            host.on_launch = self._trainer()
            self.hosts[port] = host
            return port

    def _trainer(self) -> Callable[[FakeHost, str], None]:
        seconds = self.rng.uniform(*self.trainer_seconds)

        def launch(host: FakeHost, folder: str) -> None:
            digests = host.write_folder(f"{folder}/out/checkpoints/checkpoint-2", {"adapter.safetensors": b"step 2"})
            host.emit(EventKind.CHECKPOINT, step=2, path="checkpoints/checkpoint-2", bytes=6, sha256=digests)
            timer = threading.Timer(seconds, self._finish, (host, folder))
            timer.daemon = True
            timer.start()

        return launch

    @staticmethod
    def _finish(host: FakeHost, folder: str) -> None:
        files = host.write_folder(f"{folder}/out/adapter", {"adapter_model.safetensors": b"final weights"})
        host.emit(EventKind.DONE, adapter_path="adapter", files=files)

    def kill(self, port: int, *, by_rentune: bool, name: str) -> None:
        """The machine on ``port`` goes away."""
        with self.lock:
            self.dead.add(port)
            moving = sum(count for (where, _process), count in self.transfers.items() if where == port)
            if moving and by_rentune:
                self.violations.append(f"{name} was terminated while a transfer to or from it moved")

    def forget_process(self, process: str) -> None:
        """A killed process's transfers no longer move."""
        with self.lock:
            for key in [k for k in self.transfers if k[1] == process]:
                del self.transfers[key]

    def connector(self, process: str) -> Callable[[Endpoint, str | None, float], Any]:
        """The engine's ``connect`` for one process: connections whose transfers are counted."""

        async def connect(endpoint: Endpoint, pinned: str | None, time_limit: float) -> Any:
            if endpoint.port in self.dead or endpoint.port not in self.hosts:
                raise ConnectionRefusedError(f"nothing listens on port {endpoint.port}")
            machine = await self.hosts[endpoint.port].connect(endpoint, pinned, time_limit)
            return CountedMachine(machine, self, (endpoint.port, process))

        return connect


class CloudPool:
    """One fake cloud's machines in the room: the interface of :class:`tests.fakes.machines.MachinePool`."""

    def __init__(self, room: MachineRoom, cloud: FakeCloud, name: ProviderName) -> None:
        self.room, self.cloud, self.name = room, cloud, name
        self.ports: dict[str, int] = {}

    def start(self, machine_id: str, public_key: str, env: dict[str, str] | None = None) -> MachineAddress:
        """The machine of ``machine_id`` (started on the first call)."""
        if machine_id not in self.ports or self.ports[machine_id] in self.room.dead:  # a restart is a fresh host
            self.ports[machine_id] = self.room.new_host()
        port = self.ports[machine_id]
        return MachineAddress("fake", port, "root", self.room.hosts[port].host_key, Path("/nonexistent"))

    def kill(self, machine_id: str) -> None:
        """The machine goes away: terminated through the API (Rentune's doing), or stopped by the provider."""
        port = self.ports.get(machine_id)
        if port is None:
            return
        instance = self.cloud.instances.get(machine_id)
        by_rentune = bool(instance and instance.terminated is not None and not instance.extra.get("lost"))
        self.room.kill(port, by_rentune=by_rentune, name=f"{self.name.value} {machine_id}")

    def kill_all(self) -> None:
        """Every machine of this cloud goes away."""
        for machine_id in list(self.ports):
            self.room.dead.add(self.ports[machine_id])

    def alive(self, machine_id: str) -> bool:
        """Whether the machine still runs."""
        port = self.ports.get(machine_id)
        return port is not None and port not in self.room.dead


class CountedMachine:
    """A connection to an in-memory machine whose uploads and downloads are counted while they move."""

    def __init__(self, inner: Any, room: MachineRoom, key: tuple[int, str]) -> None:
        self._inner, self._room, self._key = inner, room, key

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in {"upload", "download", "download_many"}:
            return attribute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            room, key = self._room, self._key
            with room.lock:
                room.transfers[key] = room.transfers.get(key, 0) + 1
            try:
                await asyncio.sleep(0.02)  # a transfer takes a moment: a terminate may land during it
                return await attribute(*args, **kwargs)
            finally:
                with room.lock:
                    if key in room.transfers:
                        room.transfers[key] -= 1

        return counted
