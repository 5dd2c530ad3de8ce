"""A process killed at any point of a rented run's end leaves nothing billing once the next start has run.

The end of a run is a sequence of writes and provider calls: the ledger marks the machine terminating, the run is
marked ended, the terminate goes out, the provider is asked until it says the machine is gone, the ledger books the
end. Each test here counts that sequence in a full run, then for every n kills a fresh run's process before its n-th
step (nothing of it runs after: no handler, no ``finally``, no further call), and plays the next start: settling,
then driving on whatever run did not end. At every kill point:

* the run is never marked ended while a row of it is still ``live`` (the row goes ``terminating`` first), and
* after the next start nothing bills at the fake cloud, and the ledger's dollars equal its billed seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from desktop.core.runs.progress import ENDED
from desktop.core.runs.spec import ComputeSpec, RunSpec
from desktop.services.billing.ledger import Ledger, RentalState
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import Instance
from desktop.services.renting.driver import RentalDriver
from desktop.services.renting.reconcile import settle_rentals
from desktop.services.renting.terminator import Terminator
from desktop.services.runs import checkpoints
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.store import RunRecord, RunStore
from tests.fakes.memory_cloud import MemoryCloud
from tests.fixtures.fake_machine import FakeHost
from tests.runs.rental_world import World, short_sleep, ssh_always_greets, trains_to_the_end

__all__ = ["ssh_always_greets"]  # autouse: machines greet at once


class Killed(asyncio.CancelledError):
    """The process died here. A CancelledError, so no handler of the driver takes it for a failure to clean up."""


@dataclass
class Kill:
    """Kills a process before the ``at``-th step of its run's end (counted once armed); None: never.

    Once dead, every further step of that process raises too: a dead process writes and asks nothing more.
    """

    at: int | None
    armed: bool = False
    dead: bool = False
    steps: list[str] = field(default_factory=list)

    def step(self, what: str) -> None:
        """One write or provider call of the process (counted only once the run's end has begun)."""
        if self.dead:
            raise Killed(f"dead before {what}")
        if not self.armed:
            return
        if self.at is not None and len(self.steps) + 1 >= self.at:
            self.dead = True
            raise Killed(f"killed before {what}")
        self.steps.append(what)


class DyingLedger(Ledger):
    """The ledger as the killed process writes it: every write is a step."""

    def __init__(self, kill: Kill) -> None:
        super().__init__()
        self.kill = kill

    def terminating(self, provider: str, instance_id: str) -> Any:
        """A step, then the write."""
        self.kill.step("ledger: terminating")
        return super().terminating(provider, instance_id)

    def stop_sent(self, provider: str, instance_id: str, at: float | None = None) -> None:
        """A step, then the write."""
        self.kill.step("ledger: stop sent")
        super().stop_sent(provider, instance_id, at)

    def close(self, provider: str, instance_id: str, stopped: float | None = None, **kwargs: Any) -> Any:
        """A step, then the write."""
        self.kill.step("ledger: closed")
        return super().close(provider, instance_id, stopped, **kwargs)


class DyingStore(RunStore):
    """The run store as the killed process writes it: every write is a step."""

    def __init__(self, kill: Kill) -> None:
        super().__init__()
        self.kill = kill

    def transition(self, run_id: str, state: Any, note: str = "", *, reopen: bool = False) -> RunRecord:
        """A step, then the write."""
        self.kill.step(f"run: {state.value}")
        return super().transition(run_id, state, note, reopen=reopen)

    def update(self, run_id: str, **fields: Any) -> RunRecord:
        """A step, then the write."""
        self.kill.step(f"run: {', '.join(fields)}")
        return super().update(run_id, **fields)


class DyingCloud:
    """The killed process's client of a cloud: every call that reaches the provider is a step."""

    def __init__(self, cloud: MemoryCloud, kill: Kill) -> None:
        self.cloud, self.kill = cloud, kill

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cloud, name)

    async def get(self, instance_id: str) -> Instance:
        """A step, then the call."""
        self.kill.step("provider: get")
        return await self.cloud.get(instance_id)

    async def terminate(self, instance_id: str) -> None:
        """A step, then the call."""
        self.kill.step("provider: terminate")
        await self.cloud.terminate(instance_id)


def fails(host: FakeHost, _folder: str) -> None:
    """A trainer that stops on a configuration error (the run fails)."""
    from trainer_payload.protocol import EventKind

    host.emit(EventKind.ERROR, kind="config", message="lora_r must be positive", hint="set lora_r")
    host.emit(EventKind.STATE, state="failed", reason="config")
    host.trainer_pid = None  # it exited


@dataclass
class Life:
    """One run's life in a process that may be killed.

    Attributes:
        world: The cloud and its machines (they outlive the process).
        kill: When the process dies.
        run_id: The run.
    """

    world: World
    kill: Kill
    run_id: str = ""

    def process(self) -> RentalDriver:
        """The process: its own store, ledger and clients, each step of which the kill counts."""
        options = EngineOptions(poll_seconds=0.02, grace_seconds=0.5)
        store, ledger = DyingStore(self.kill), DyingLedger(self.kill)
        engine = RunEngine(store, SecretStore(), options, report=self.world.lines.append, connect=self.world.connect)
        return RentalDriver(
            engine,
            ledger=ledger,
            # The provider is not polled while training: every step counted is the end's own.
            options=replace(self.world.driver.options, poll_seconds=60.0),
            open_provider=lambda name, _s: DyingCloud(self.world.clouds[name], self.kill),
            installation="0123abcd",
            terminator=Terminator(ledger, sleep=short_sleep),
        )

    async def live(self) -> None:
        """Creates the run and drives it until it ends or the process is killed."""
        driver = self.process()
        spec = RunSpec("org/tiny-model", self.world.train, None, {"max_steps": 4}, None, 0.0)
        spec = RunSpec(**{**spec.__dict__, "compute": ComputeSpec("runpod", gpu="RTX 4090", spot=True)})
        self.run_id = driver.engine.create(spec).id
        try:
            await asyncio.wait_for(driver.drive(self.run_id), 30)
        except TimeoutError:
            raise AssertionError(self.world.lines) from None
        except asyncio.CancelledError:
            assert self.kill.dead, "only the kill stops the run here"

    async def next_start(self) -> None:
        """The next start: settling (as the app and every settling command do), then driving a run not ended."""
        ledger = Ledger()
        await settle_rentals(
            RunStore(),
            ledger=ledger,
            open=lambda name, _s: self.world.clouds[name],
            terminator=Terminator(ledger, sleep=short_sleep),
        )
        if RunStore().get(self.run_id).state not in ENDED:
            await asyncio.wait_for(self.world.driver_for(self.world).drive(self.run_id), 30)


def arm_when_the_adapter_is_home(monkeypatch: pytest.MonkeyPatch, kills: list[Kill]) -> None:
    """The end begins when the adapter has arrived home (the pull returned)."""
    real = checkpoints.pull_adapter

    async def pulled(*args: Any) -> Path:
        local = await real(*args)
        kills[-1].armed = True
        return local

    monkeypatch.setattr(checkpoints, "pull_adapter", pulled)


def arm_when_the_run_fails(monkeypatch: pytest.MonkeyPatch, kills: list[Kill]) -> None:
    """The end begins when the engine decides the run failed."""
    from desktop.services.runs.context import RunContext

    real = RunContext.fail

    def failing(self: RunContext, run_id: str, why: str) -> RunRecord:
        kills[-1].armed = True
        return real(self, run_id, why)

    monkeypatch.setattr(RunContext, "fail", failing)


def assert_never_ended_with_a_live_row(run_id: str, at: str) -> None:
    """The ordering: a run marked ended has no live row (its rows went terminating first)."""
    if RunStore().get(run_id).state in ENDED:
        live = [r for r in Ledger().rentals(run_id) if r.state is RentalState.LIVE]
        assert not live, f"killed {at}: the run is marked ended while its row is still live: {live}"


def assert_nothing_bills(world: World, run_id: str, at: str) -> None:
    """The fake bills nothing, and the ledger's dollars are its billed seconds (within 1 %)."""
    assert world.runpod.live() == [], f"killed {at}: the machine still bills after the next start"
    for row in Ledger().rentals(run_id):
        if row.instance_id is None:
            continue
        billed = world.runpod.billed_seconds(row.instance_id) * row.price_per_hour / 3600
        assert row.stopped is not None, f"killed {at}: {row} is not closed"
        assert row.usd(row.stopped) == pytest.approx(billed, rel=0.01, abs=1e-9), f"killed {at}: {row}"


async def kill_at_every_step(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    arm: Callable[[pytest.MonkeyPatch, list[Kill]], None],
    trainer: Callable[[FakeHost, str], None],
) -> list[str]:
    """Counts the steps of a whole end, then kills a fresh run before each; returns the steps (for the message)."""
    kills: list[Kill] = []
    arm(monkeypatch, kills)

    async def life(at: int | None, home: str) -> Life:
        monkeypatch.setenv("RENTUNE_HOME", str(tmp_path / home))
        world = World(tmp_path / home)
        world.runpod.on_create = lambda host: setattr(host, "on_launch", trainer)
        kills.append(Kill(at))
        lived = Life(world, kills[-1])
        await lived.live()
        return lived

    whole = await life(None, "whole")
    steps = whole.kill.steps
    assert "provider: terminate" in steps and whole.world.runpod.live() == [], steps
    for at in range(1, len(steps) + 1):
        killed = await life(at, f"kill-{at}")
        where = f"before step {at} ({steps[at - 1]}) of {steps}"
        assert killed.kill.dead, f"the process was to die {where}"
        assert_never_ended_with_a_live_row(killed.run_id, where)
        await killed.next_start()
        assert_nothing_bills(killed.world, killed.run_id, where)
    return steps


async def test_a_kill_at_any_step_after_the_adapter_is_home_leaves_nothing_billing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = await kill_at_every_step(tmp_path, monkeypatch, arm_when_the_adapter_is_home, trains_to_the_end)
    assert steps.index("ledger: terminating") < steps.index("run: finished"), "the row goes terminating first"


async def test_a_kill_at_any_step_of_a_failed_runs_end_leaves_nothing_billing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = await kill_at_every_step(tmp_path, monkeypatch, arm_when_the_run_fails, fails)
    assert steps.index("ledger: terminating") < steps.index("run: failed"), "the row goes terminating first"
