"""The rental driver wired to in-memory clouds and hosts: a run's world without sshd, HTTP or training."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.spec import ComputeSpec, RunSpec, ServeSpec
from desktop.services.billing.ledger import Ledger
from desktop.services.machines.ssh import Endpoint
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import ProviderName
from desktop.services.renting import driver as rental
from desktop.services.renting.creating import CreateTiming
from desktop.services.renting.driver import RentalDriver, RentalOptions
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.store import RunStore
from tests.fakes.memory_cloud import MemoryCloud, offer
from tests.fixtures.fake_machine import FakeHost
from trainer_payload.protocol import EventKind

__all__ = ["World", "checkpoint_then_keep_training", "ssh_always_greets", "trains_to_the_end"]


async def short_sleep(_seconds: float) -> None:
    """A terminator's backoff, shortened for tests."""
    await asyncio.sleep(0.01)


def checkpoint_then_keep_training(host: FakeHost, folder: str) -> None:
    digests = host.write_folder(f"{folder}/out/checkpoints/checkpoint-2", {"adapter.safetensors": b"step 2"})
    host.emit(EventKind.CHECKPOINT, step=2, path="checkpoints/checkpoint-2", bytes=6, sha256=digests)


def trains_to_the_end(host: FakeHost, folder: str) -> None:
    files = host.write_folder(f"{folder}/out/adapter", {"adapter_model.safetensors": b"final weights"})
    host.emit(EventKind.DONE, adapter_path="adapter", files=files)


@pytest.fixture(autouse=True)
def ssh_always_greets(monkeypatch: pytest.MonkeyPatch) -> None:
    async def greets(_host: str, _port: int, time_limit: float = 5.0) -> bool:
        return True

    monkeypatch.setattr(rental, "ssh_banner", greets)


class World:
    """Two clouds, their hosts, an engine and a driver wired to them."""

    def __init__(self, tmp_path: Path, *, max_machines: int = 5) -> None:
        self.hosts: dict[int, FakeHost] = {}
        self.lines: list[str] = []
        self.runpod = MemoryCloud(ProviderName.RUNPOD, [offer(ProviderName.RUNPOD, "rp-1", 0.30)], self.hosts)
        self.vast = MemoryCloud(ProviderName.VAST, [offer(ProviderName.VAST, "va-1", 0.25)], self.hosts)
        clouds = {ProviderName.RUNPOD: self.runpod, ProviderName.VAST: self.vast}
        options = EngineOptions(poll_seconds=0.02, grace_seconds=0.5)
        self.engine = RunEngine(RunStore(), SecretStore(), options, report=self.lines.append, connect=self.connect)
        driver_options = RentalOptions(
            poll_seconds=0.05,
            ready_poll_seconds=0.01,
            max_machines=max_machines,
            budget_poll_seconds=0.02,
            terminate_patience=0.5,
            create=CreateTiming(answer_wait=2.0, lookup_delay=0.01, terminate_patience=0.5),
        )
        self.clouds = clouds
        self.ledger = Ledger()
        self.terminator = Terminator(self.ledger, sleep=short_sleep)
        self.driver = RentalDriver(
            self.engine,
            ledger=self.ledger,
            options=driver_options,
            open_provider=lambda n, _s: clouds[n],
            installation="0123abcd",
            terminator=self.terminator,
        )
        self.train = tmp_path / "train.jsonl"
        self.train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')

    def driver_for(self, world: World) -> RentalDriver:
        """A second process's driver on ``world``'s clouds and machines (its own engine, same store and ledger)."""
        engine = RunEngine(
            RunStore(),
            SecretStore(),
            EngineOptions(poll_seconds=0.02, grace_seconds=0.5),
            report=self.lines.append,
            connect=world.connect,
        )
        return RentalDriver(
            engine,
            ledger=Ledger(),
            options=world.driver.options,
            open_provider=lambda n, _s: world.clouds[n],
            installation="0123abcd",
            terminator=Terminator(Ledger(), sleep=short_sleep),
        )

    async def connect(self, endpoint: Endpoint, pinned: str | None, time_limit: float) -> Any:
        return await self.hosts[endpoint.port].connect(endpoint, pinned, time_limit)

    def create(self, compute: ComputeSpec, budget: float = 0.0, serve: ServeSpec | None = None) -> str:
        training = {"max_steps": 4, **({"method": "lora"} if serve else {})}
        spec = RunSpec("org/tiny-model", self.train, None, training, None, budget, compute=compute, serve=serve)
        return self.engine.create(spec).id
