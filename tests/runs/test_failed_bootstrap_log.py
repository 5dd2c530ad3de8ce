"""A failed bootstrap's (or trainer's) log comes home before its machine goes, and the advice names the copy here.

A new user's first launch failed in its bootstrap; the rented machine was terminated at once, and the advice sent
the user to a log on it. Driven through in-memory clouds and machines (no sshd): whatever the driver terminates
loses its disk here, as a terminated machine does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from desktop.core.runs.progress import RunProgress
from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.services.runs import machine_logs
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.launch import BOOTSTRAP_LOG, TRAINER_LOG
from desktop.services.runs.machine_logs import LOG_LIMIT, bring_log_home
from desktop.services.runs.snapshot import read_snapshot
from desktop.ui.pages.monitor_text import notice
from tests.fixtures.fake_machine import FakeHost, FakeMachine, Script, machine_ready
from tests.runs.rental_world import World, ssh_always_greets  # noqa: F401 - autouse: machines greet at once
from trainer_payload.failures import hint
from trainer_payload.protocol import ErrorKind, EventKind, JobState

HF_TOKEN = "hf_" + "TokenThatMustStayOffDisk1234567"
#: The bootstrap's output on a bare image before the fix, a token among it (a log is not trusted to be clean).
BARE_IMAGE_LOG = (
    f"HF_TOKEN={HF_TOKEN}\n"
    "Traceback (most recent call last):\n"
    '  File "/root/run/payload/trainer_payload/lock.py", line 70, in applies\n'
    "AttributeError: module 'pip._vendor.packaging' has no attribute 'markers'\n"
)
ATTRIBUTE_ERROR = "AttributeError: module 'pip._vendor.packaging' has no attribute 'markers'"


def fails_like_a_bare_image(host: FakeHost, folder: str) -> None:
    """The bootstrap writes its log and says it failed, as the payload did on a Python without ``packaging``."""
    host.files[f"{folder}/{BOOTSTRAP_LOG}"] = BARE_IMAGE_LOG.encode()
    host.emit(EventKind.ERROR, kind=ErrorKind.INTERNAL, message=ATTRIBUTE_ERROR, hint=hint(ErrorKind.INTERNAL))


def dies_without_a_word(host: FakeHost, folder: str) -> None:
    """The bootstrap's Python could not even start: its log holds the shell's complaint, no event says why."""
    host.files[f"{folder}/{BOOTSTRAP_LOG}"] = b"sh: 1: /opt/conda/bin/python3: not found\n"


def machines_lose_their_disk_when_terminated(world: World, hosts: list[FakeHost]) -> None:
    """A terminated machine's files are gone: a log fetched after the terminate would find nothing."""
    terminate = world.runpod.terminate

    async def terminate_and_wipe(instance_id: str) -> None:
        for host in hosts:
            host.files.clear()
        await terminate(instance_id)

    world.runpod.terminate = terminate_and_wipe  # type: ignore[method-assign]


def rented_run(world: World, bootstrap: Script, trainer: Script | None = None) -> str:
    """A RunPod run whose machine's bootstrap (and trainer) do as told; a terminated machine loses its files."""
    hosts: list[FakeHost] = []

    def made(host: FakeHost) -> None:
        hosts.append(host)
        host.on_bootstrap = bootstrap
        if trainer is not None:
            host.on_launch = trainer

    world.runpod.on_create = made
    machines_lose_their_disk_when_terminated(world, hosts)
    return world.create(ComputeSpec("runpod", gpu="RTX 4090", spot=True))


async def test_a_failed_bootstrap_brings_its_log_home_before_the_machine_is_terminated(tmp_path: Path) -> None:
    world = World(tmp_path)
    run_id = rented_run(world, fails_like_a_bare_image)

    final = await asyncio.wait_for(world.driver.drive(run_id), 30)

    local = world.engine.folder(run_id) / "bootstrap.log"
    assert final.state is RunState.FAILED and world.runpod.terminated == ["runpod-1"]
    assert local.read_text() == BARE_IMAGE_LOG.replace(HF_TOKEN, "***"), "all of it, the token masked"
    assert final.error is not None and ATTRIBUTE_ERROR in final.error
    assert final.error.endswith(f". The machine's log is on this computer: {local}")
    assert final.spec["machine_log"] == str(local)
    progress = RunProgress()
    progress.apply_all(mirrored_events(world.engine.folder(run_id)))
    shown = notice(progress, read_snapshot(world.engine.store, run_id))
    assert shown is not None and ATTRIBUTE_ERROR in shown.details
    assert shown.details.endswith(f"The machine's log is on this computer: {local}"), "the app's advice names it"


async def test_a_bootstrap_that_dies_silently_says_its_last_lines_from_the_copy_at_home(tmp_path: Path) -> None:
    world = World(tmp_path)
    run_id = rented_run(world, dies_without_a_word)

    final = await asyncio.wait_for(world.driver.drive(run_id), 30)

    local = world.engine.folder(run_id) / "bootstrap.log"
    assert final.state is RunState.FAILED and world.runpod.terminated == ["runpod-1"]
    assert final.error is not None and "(sh: 1: /opt/conda/bin/python3: not found)" in final.error
    assert final.error.endswith(f". The machine's log is on this computer: {local}")
    assert local.read_text() == "sh: 1: /opt/conda/bin/python3: not found\n"


def trainer_fails(host: FakeHost, folder: str) -> None:
    """The trainer writes its traceback to its log, says what failed, and exits."""
    host.files[f"{folder}/{TRAINER_LOG}"] = b"Traceback (most recent call last):\nRuntimeError: CUDA error\n"
    host.emit(
        EventKind.ERROR, kind=ErrorKind.INTERNAL, message="RuntimeError: CUDA error", hint=hint(ErrorKind.INTERNAL)
    )
    host.emit(EventKind.STATE, state=JobState.FAILED, reason="RuntimeError: CUDA error")
    host.trainer_pid = None


async def test_a_failed_trainers_log_comes_home_too_before_the_machine_is_terminated(tmp_path: Path) -> None:
    world = World(tmp_path)
    run_id = rented_run(world, machine_ready, trainer_fails)

    final = await asyncio.wait_for(world.driver.drive(run_id), 30)

    local = world.engine.folder(run_id) / "payload.log"
    assert final.state is RunState.FAILED and world.runpod.terminated == ["runpod-1"]
    assert local.read_text().endswith("RuntimeError: CUDA error\n")
    assert final.error is not None and final.error.endswith(f". The machine's log is on this computer: {local}")


# -- what comes home from an untrusted machine ---------------------------------------------------------------------


@pytest.fixture
def on_machine(tmp_path: Path) -> tuple[World, str, FakeHost]:
    """A run pointed at an in-memory machine (no driving): (its world, the run id, the machine)."""
    world = World(tmp_path)
    run_id = world.create(ComputeSpec("runpod", gpu="RTX 4090"))
    world.engine.store.update(run_id, remote_dir="/home/fake/run")
    return world, run_id, FakeHost()


async def test_only_the_end_of_a_huge_log_comes_home_saying_what_was_left_out(
    on_machine: tuple[World, str, FakeHost],
) -> None:
    world, run_id, host = on_machine
    host.files[f"/home/fake/run/{BOOTSTRAP_LOG}"] = b"x" * (3 * LOG_LIMIT) + b"\nthe last words\n"

    local = await bring_log_home(world.engine.ctx, run_id, FakeMachine(host), BOOTSTRAP_LOG)

    assert local == world.engine.folder(run_id) / "bootstrap.log"
    text = local.read_text()
    assert text.startswith(f"[the first {2 * LOG_LIMIT + 16:,} bytes of the machine's log were left out]\n")
    assert text.endswith("the last words\n") and len(text.encode()) < LOG_LIMIT + 100


async def test_a_machine_lying_about_the_size_still_sends_no_more_than_the_limit(
    on_machine: tuple[World, str, FakeHost],
) -> None:
    world, run_id, host = on_machine
    host.files[f"/home/fake/run/{BOOTSTRAP_LOG}"] = b"y" * (2 * LOG_LIMIT)
    machine = FakeMachine(host)
    answer = host.answer

    def says_it_is_tiny(command: str) -> str:
        return "12\n" if command.startswith("wc -c") else answer(command)

    host.answer = says_it_is_tiny  # type: ignore[method-assign]
    local = await bring_log_home(world.engine.ctx, run_id, machine, BOOTSTRAP_LOG)
    assert local is not None and local.stat().st_size == LOG_LIMIT


async def test_no_log_or_a_machine_that_never_answers_leaves_nothing_and_says_nothing(
    on_machine: tuple[World, str, FakeHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    world, run_id, host = on_machine
    machine = FakeMachine(host)
    assert await bring_log_home(world.engine.ctx, run_id, machine, BOOTSTRAP_LOG) is None
    host.files[f"/home/fake/run/{BOOTSTRAP_LOG}"] = b"never read"

    async def hangs(_remote: str, _offset: int, _limit: int = 0) -> bytes | None:
        await asyncio.sleep(3600)
        return None

    monkeypatch.setattr(machine, "read_from", hangs)
    monkeypatch.setattr(machine_logs, "LOG_SECONDS", 0.05)
    assert await asyncio.wait_for(bring_log_home(world.engine.ctx, run_id, machine, BOOTSTRAP_LOG), 5) is None
    assert not (world.engine.folder(run_id) / "bootstrap.log").exists()
    assert machine_logs.with_log("it failed", None) == "it failed"
    assert "machine_log" not in world.engine.store.get(run_id).spec
