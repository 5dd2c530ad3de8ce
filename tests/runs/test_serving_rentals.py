"""Serving from a rented machine after training, in process: the machine bills while it serves and never after.

The world is in memory (clouds, machines; the machine's server is a listener on 127.0.0.1 that answers as vLLM
would). The same life with real parts (sshd, the payload's serve, llama.cpp's server): test_serve_on_machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from desktop.core.runs.spec import ComputeSpec, ServeSpec
from desktop.core.runs.states import RunState
from desktop.services.providers.base import ProviderName
from desktop.services.runs.store import RunRecord, RunStore
from tests.fakes.memory_cloud import offer
from tests.fixtures.fake_machine import FakeHost
from tests.runs.rental_world import (
    World,
    ssh_always_greets,  # noqa: F401 - autouse: machines greet at once
    trains_to_the_end,
)
from tests.runs.test_rental_money import assert_books_balance

RENTED = ComputeSpec("runpod", gpu="RTX 4090", spot=True)


def serving_world(tmp_path: Path) -> tuple[World, list[FakeHost]]:
    world = World(tmp_path)
    hosts: list[FakeHost] = []

    def created(host: FakeHost) -> None:
        host.on_launch = trains_to_the_end
        hosts.append(host)

    world.runpod.on_create = created
    return world, hosts


async def until_serving(run_id: str, limit_s: float = 20) -> RunRecord:
    async with asyncio.timeout(limit_s):
        while not (RunStore().get(run_id).spec.get("serving") or {}).get("url"):
            await asyncio.sleep(0.02)
    return RunStore().get(run_id)


async def ask(url: str) -> str:
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{url}/chat/completions", json={"model": "tuned", "messages": []})
    return str(answer.json()["choices"][0]["message"]["content"])


async def test_the_machine_bills_while_it_serves_and_is_terminated_as_soon_as_serving_ends(tmp_path: Path) -> None:
    world, hosts = serving_world(tmp_path)
    run_id = world.create(RENTED, serve=ServeSpec(idle_minutes=30))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    run = await until_serving(run_id)
    [host] = hosts
    assert run.state is RunState.SERVING and run.adapter, "the adapter came home first"
    assert [i.instance_id for i in world.runpod.live()] == ["runpod-1"], "kept: it serves"
    assert await ask(run.spec["serving"]["url"]) == "hi"
    await asyncio.sleep(0.2)
    assert RunStore().get(run_id).spec["serving"]["requests"] == 1, "the app's own first request is not counted"
    host.end_serving("no request for 30 min")
    final = await asyncio.wait_for(drive, 20)
    assert final.state is RunState.FINISHED and final.spec["served"] == {
        "requests": 1,
        "reason": "no request for 30 min",
    }
    assert world.runpod.live() == [] and world.runpod.terminated == ["runpod-1"]
    assert host.serve_starts == 1
    assert not any("still coming up when Rentune last stopped" in line for line in world.lines), "one process"
    assert_books_balance(world, world.runpod, run_id)


@pytest.mark.parametrize("guard", ["rental timer", "engine"])
async def test_the_budget_ends_serving_and_the_run_still_finishes_with_its_adapter(tmp_path: Path, guard: str) -> None:
    """Either guard may see it first: the rental driver's timer, or the engine's own check (an own server's only)."""
    world, _hosts = serving_world(tmp_path)
    world.runpod._offers = [offer(ProviderName.RUNPOD, "dear", 3600.0)]  # $1 a second
    if guard == "engine":
        world.driver.options = replace(world.driver.options, budget_poll_seconds=3600.0)
    run_id = world.create(RENTED, budget=10_000.0, serve=ServeSpec(idle_minutes=30))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    await until_serving(run_id)
    blind = {"hourly_rate_usd": 0.0} if guard == "rental timer" else {}  # the engine's check needs the rate
    world.engine.ctx.set_spec(run_id, budget_usd=world.driver.spent(run_id) + 100.0, **blind)  # < 3 min of stopping
    final = await asyncio.wait_for(drive, 20)
    assert final.state is RunState.FINISHED and final.adapter, "trained and home: a success, not a failure"
    note = str(RunStore().transitions(run_id)[-1]["note"])
    words = "; serving stopped: the budget of $" if guard == "rental timer" else "served 0 requests; budget of $"
    assert words in note, note
    assert world.runpod.live() == [] and world.runpod.terminated == ["runpod-1"]
    assert_books_balance(world, world.runpod, run_id)


async def test_a_machine_lost_while_it_serves_ends_the_run_and_no_other_machine_is_rented(tmp_path: Path) -> None:
    world, hosts = serving_world(tmp_path)
    run_id = world.create(RENTED, serve=ServeSpec(idle_minutes=30))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    await until_serving(run_id)
    world.runpod.take_away("runpod-1")
    final = await asyncio.wait_for(drive, 20)
    assert final.state is RunState.FINISHED and final.adapter
    assert world.runpod.terminated == ["runpod-1"] and len(hosts) == 1, "trained and home: nothing to move"
    assert world.runpod.live() == []
    assert_books_balance(world, world.runpod, run_id)


async def test_stop_from_another_process_ends_serving_and_the_machine(tmp_path: Path) -> None:
    world, _hosts = serving_world(tmp_path)
    run_id = world.create(RENTED, serve=ServeSpec(idle_minutes=30))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    await until_serving(run_id)
    other = world.driver_for(world)
    await other.engine.stop(run_id)  # the CLI's rentune stop while the app follows the run
    final = await asyncio.wait_for(drive, 20)
    assert final.state is RunState.FINISHED and final.spec["served"]["reason"] == "stopped"
    assert world.runpod.live() == [] and world.runpod.terminated == ["runpod-1"]
    assert_books_balance(world, world.runpod, run_id)


async def test_a_lost_connection_finds_the_same_server_again_at_the_same_address(tmp_path: Path) -> None:
    world, hosts = serving_world(tmp_path)
    run_id = world.create(RENTED, serve=ServeSpec(idle_minutes=30))
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    url = (await until_serving(run_id)).spec["serving"]["url"]
    [host] = hosts
    connects = host.connects
    host.drop_after("/proc/6161/status")  # the next liveness check loses its connection
    async with asyncio.timeout(20):
        while host.connects == connects:
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    assert await ask(url) == "hi", "the same port on this computer, forwarded again"
    assert host.serve_starts == 1, "never started twice"
    host.end_serving("no request for 30 min")
    final = await asyncio.wait_for(drive, 20)
    assert final.state is RunState.FINISHED and final.spec["served"]["requests"] == 1
    assert world.runpod.live() == []


async def test_an_app_killed_while_it_serves_finds_the_server_again_at_its_next_start_and_ends_the_machine(
    tmp_path: Path,
) -> None:
    world, hosts = serving_world(tmp_path)
    run_id = world.create(RENTED, serve=ServeSpec(idle_minutes=30))
    first = asyncio.ensure_future(world.driver.drive(run_id))
    url = (await until_serving(run_id)).spec["serving"]["url"]
    first.cancel()  # the process dies: nothing is said to the machine, the forwarded port closes
    with contextlib.suppress(asyncio.CancelledError):
        await first
    assert [i.instance_id for i in world.runpod.live()] == ["runpod-1"], "still serving, still billing"
    restarted = world.driver_for(world)
    drive = asyncio.ensure_future(restarted.drive(run_id))
    async with asyncio.timeout(20):
        while RunStore().get(run_id).spec["serving"].get("checks") != 2:
            await asyncio.sleep(0.02)
    assert RunStore().get(run_id).spec["serving"]["url"] == url, "the same address on this computer again"
    assert await ask(url) == "hi"
    [host] = hosts
    assert host.serve_starts == 1, "found again, never started twice"
    host.end_serving("no request for 30 min")
    final = await asyncio.wait_for(drive, 20)
    assert final.state is RunState.FINISHED and final.spec["served"]["requests"] == 1
    assert world.runpod.live() == [] and world.runpod.terminated == ["runpod-1"]
    assert_books_balance(world, world.runpod, run_id)


async def test_a_server_that_does_not_start_is_said_and_the_run_finishes_with_its_adapter(tmp_path: Path) -> None:
    world, _hosts = serving_world(tmp_path)
    world.runpod.on_create = lambda host: (setattr(host, "on_launch", trains_to_the_end), host.refuse(
        "-m trainer_payload serve", "python: No module named trainer_payload.serve"))  # fmt: skip
    run_id = world.create(RENTED, serve=ServeSpec(idle_minutes=30))
    final = await asyncio.wait_for(world.driver.drive(run_id), 20)
    assert final.state is RunState.FINISHED and final.adapter
    assert "No module named trainer_payload.serve" in str(final.spec.get("serve_error"))
    assert world.runpod.live() == []


async def test_a_stop_that_came_during_the_final_pull_serves_nothing(tmp_path: Path) -> None:
    world, hosts = serving_world(tmp_path)
    run_id = ""

    def trains_then_the_user_stops(host: FakeHost, folder: str) -> None:
        trains_to_the_end(host, folder)
        world.engine.ctx.set_spec(run_id, stop_requested=True)  # Stop pressed as the adapter is coming home

    world.runpod.on_create = lambda host: (setattr(host, "on_launch", trains_then_the_user_stops), hosts.append(host))
    run_id = world.create(RENTED, serve=ServeSpec(idle_minutes=30))
    final = await asyncio.wait_for(world.driver.drive(run_id), 20)
    assert final.state is RunState.FINISHED and final.adapter and final.spec.get("serving") is None
    assert [host.serve_starts for host in hosts] == [0] and world.runpod.live() == []


async def test_the_training_idle_guard_never_ends_serving(tmp_path: Path) -> None:
    """Serving moves no training step: the idle guard of [compute] idle_minutes must not take the machine away."""
    world, hosts = serving_world(tmp_path)
    run_id = world.create(replace(RENTED, idle_minutes=0.01), serve=ServeSpec(idle_minutes=30))  # 0.6 s
    drive = asyncio.ensure_future(world.driver.drive(run_id))
    await until_serving(run_id)
    await asyncio.sleep(2.0)
    assert not drive.done() and RunStore().get(run_id).state is RunState.SERVING
    assert [i.instance_id for i in world.runpod.live()] == ["runpod-1"]
    hosts[0].end_serving("no request for 30 min")
    final = await asyncio.wait_for(drive, 20)
    assert final.state is RunState.FINISHED and world.runpod.live() == []
