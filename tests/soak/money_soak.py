"""The money soak: seeded random fault schedules over the three fake clouds, and the invariants renting must keep.

Each schedule (one seed) starts a Rentune "process" (its own thread and event loop, engine and driver) that rents and
drives a few runs at once through the real provider clients, against the fakes of RunPod, Vast.ai and Lambda served
in-process. The fakes' machines are in-memory hosts (no sshd) whose trainer finishes after a random time. Faults are
injected at every kind of call: 5xx answers and timeouts after the provider acted, 429s, dropped connections, a slow
provider, outbid and preempted spot machines, lost machines, terminates that keep failing, and the process killed at
a random moment (or right after a create took effect) and restarted: a kill stops the process's event loop, so none
of its cleanup runs, as with a real kill. After each schedule everything settles as a next start would (faults
cleared) and three invariants are checked:

1. no machine runs at a fake without a ``live`` or ``terminating`` ledger row of this installation;
2. each rental's dollars equal the fake's billed seconds times its price, within 1 %;
3. no adapter that reached home is lost, and no machine is taken away by Rentune while a transfer to or from it moves.

``python -m tests.soak --seeds 60`` runs the long soak (``make soak``); the tests run a short seed set.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import keyring

from desktop.core.runs.labels import parse_label
from desktop.core.runs.spec import ComputeSpec, RunSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import BILLING_STATES, Ledger
from desktop.services.machines.ssh import Endpoint
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import installation_id
from desktop.services.providers.base import Provider, ProviderName
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.lambda_cloud import LambdaProvider, Pacer
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.providers.vast import VastProvider
from desktop.services.renting import driver as rental_driver
from desktop.services.renting.creating import CreateTiming
from desktop.services.renting.driver import RentalDriver, RentalOptions
from desktop.services.renting.reconcile import RENTING_LOCK_NAME, settle_rentals
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.context import DRIVER_LOCK_NAME, ENDED
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.store import RunStore
from tests.fakes.http import CallFault, FakeCloud, FaultKind
from tests.fakes.lambda_cloud import FakeLambda
from tests.fakes.machines import MachineAddress
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast
from tests.fixtures.fake_machine import FakeHost
from tests.fixtures.memory_keyring import MemoryKeyring
from trainer_payload.protocol import EventKind

#: The GPU each fake sells that runs ask for.
GPU = {ProviderName.RUNPOD: "RTX 4090", ProviderName.VAST: "RTX 4090", ProviderName.LAMBDA: "A10"}
#: Where each client finds its fake (the in-process transport ignores the host).
URL = {
    ProviderName.RUNPOD: "https://runpod.fake/v2",
    ProviderName.VAST: "https://vast.fake/api/v0",
    ProviderName.LAMBDA: "https://lambda.fake/api/v1",
}
#: Paths of the calls that create a machine, per provider.
CREATE = {
    ProviderName.RUNPOD: ("POST", r"/pods$"),
    ProviderName.VAST: ("PUT", r"/asks/"),
    ProviderName.LAMBDA: ("POST", r"/instance-operations/launch"),
}
#: Seconds the app's and the fake's clock readings around one call may differ (both read time.time()).
CLOCK_SKEW_S = 0.05
#: Seconds Rentune may take to notice a machine its provider took away without saying when (polls, slow answers).
NOTICE_S = 6.0
#: Seconds an end Rentune estimated (the provider reports none) may be off from the provider's: one terminate's
#: round trip, the answer included, on an event loop shared by four runs on a loaded computer. A soak rental lasts
#: seconds, so 1 % of it is less than that; over a real rental of ten minutes it is under 0.05 %.
ROUND_TRIP_S = 0.25
#: Seconds a schedule may take before it counts as stuck (itself a failure).
SCHEDULE_LIMIT_S = 90.0


# -- machines in memory ------------------------------------------------------------------------------------------


class MachineRoom:
    """Every in-memory machine of a schedule, found by port, with the transfers that move to and from each.

    A machine's trainer finishes (a checkpoint, then the adapter) a random time after it is launched. A killed machine
    refuses new connections. Rentune terminating a machine while a transfer to or from it moves (one of a process
    still alive) is recorded as a violation; the provider taking one away (outbid, preempted, lost) is not.
    """

    def __init__(self, rng: random.Random, violations: list[str]) -> None:
        self.rng, self.violations = rng, violations
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
        seconds = self.rng.uniform(0.3, 2.0)

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


# -- processes ---------------------------------------------------------------------------------------------------


class KillSwitchTransport(httpx.AsyncBaseTransport):
    """A client transport that can kill its process right after a chosen call took effect at the provider."""

    def __init__(self, inner: httpx.AsyncBaseTransport, process: Process) -> None:
        self.inner, self.process = inner, process

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Passes the call on; kills the process after it when it matches the kill point."""
        if self.process.killed.is_set():
            await asyncio.Event().wait()  # a killed process makes no more calls
        response = await self.inner.handle_async_request(request)
        point = self.process.kill_after
        if point is not None and request.method == point[0] and re.search(point[1], request.url.path):
            self.process.kill_after = None
            self.process.kill()
            await asyncio.Event().wait()
        return response


class Process:
    """One Rentune process: a thread with its own event loop, engine and rental driver. :meth:`kill` stops it dead."""

    graveyard: list[Any] = []  # noqa: RUF012 - killed loops and their tasks, kept so no cleanup ever runs

    def __init__(self, soak: Schedule, name: str) -> None:
        self.soak, self.name = soak, name
        self.killed = threading.Event()
        self.kill_after: tuple[str, str] | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.lines: list[str] = []
        store = RunStore()
        self.engine = RunEngine(
            store,
            SecretStore(),
            EngineOptions(poll_seconds=0.02, grace_seconds=1.0),
            report=self.lines.append,
            connect=soak.room.connector(name),
        )
        ledger = Ledger()
        self.driver = RentalDriver(
            self.engine,
            ledger=ledger,
            options=RentalOptions(
                poll_seconds=0.05,
                ready_poll_seconds=0.02,
                budget_poll_seconds=0.05,
                terminate_patience=1.0,
                create=CreateTiming(answer_wait=1.0, lookup_delay=0.02, terminate_patience=1.0),
            ),
            open_provider=lambda name, _secrets: soak.client(name, self),
            terminator=Terminator(ledger, sleep=_short_sleep),
        )
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Any) -> concurrent.futures.Future[Any]:
        """Runs a coroutine on the process's loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def kill(self) -> None:
        """Stops the process dead: its loop stops, nothing it was doing finishes, no cleanup runs."""
        self.killed.set()
        self.loop.call_soon_threadsafe(self.loop.stop)

    def bury(self) -> None:
        """After a kill: keeps the dead loop and its tasks (so nothing is ever collected and cleaned up)."""
        self.thread.join(5)
        Process.graveyard.append((self.loop, list(asyncio.all_tasks(self.loop))))

    def stop(self) -> None:
        """Ends a process that finished its work."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))  # the cancelled tasks end here, on a live process
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()


def stuck_tasks(process: Process) -> list[str]:
    """Where each task of a stopped process waited (for a schedule that got stuck)."""
    lines = []
    for task in asyncio.all_tasks(process.loop):
        chain, coroutine = [], task.get_coro()
        while coroutine is not None and hasattr(coroutine, "cr_frame"):
            frame = coroutine.cr_frame
            if frame is not None:
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            coroutine = coroutine.cr_await
        lines.append(f"task {task.get_name()}: {' -> '.join(chain)} (waits on {coroutine!r:.80})")
    return lines


async def _short_sleep(_seconds: float) -> None:
    await asyncio.sleep(0.02)


# -- one schedule ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one schedule did and found.

    Attributes:
        seed: The schedule's seed.
        rentals: Machines rented (ledger rows with a machine).
        faults: Faults injected, by kind.
        kills: Processes killed and restarted.
        violations: Invariant breaks (empty: none).
        log: What the last process said, when the schedule got stuck.
        estimated_ends: Rentals whose machine the provider took away without an end time (checked for lateness).
        gaps: Per rental, booked minus billed seconds, and how its end was known: "reported" by the provider,
            "estimated" (when the terminate was accepted), or "noticed" (a machine taken away, seen gone).
    """

    seed: int
    rentals: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    estimated_ends: int = 0
    gaps: list[tuple[float, str]] = field(default_factory=list)


class Schedule:
    """One seeded schedule: the fakes, the runs, the faults and the kills, then the invariants."""

    def __init__(self, seed: int, root: Path, runs: int = 4) -> None:
        self.seed, self.root, self.runs = seed, root, runs
        self.rng = random.Random(seed)
        self.outcome = Outcome(seed)
        self.room = MachineRoom(self.rng, self.outcome.violations)
        self.clouds: dict[ProviderName, FakeCloud] = {
            ProviderName.RUNPOD: FakeRunPod(root / "runpod", boot_seconds=0.2),
            ProviderName.VAST: FakeVast(root / "vast", boot_seconds=0.2),
            ProviderName.LAMBDA: FakeLambda(root / "lambda", boot_seconds=0.2, limits=None),  # see client()
        }
        for name, cloud in self.clouds.items():
            cloud.pool = CloudPool(self.room, cloud, name)  # type: ignore[assignment]
        self.train = root / "train.jsonl"
        self.train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')

    def client(self, name: ProviderName, process: Process) -> Provider:
        """A real client of ``name`` talking to its fake through the process's kill switch."""
        cloud = self.clouds[name]
        transport = KillSwitchTransport(cloud.transport(), process)
        retry = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.05)
        key = cloud.valid_key
        if name is ProviderName.RUNPOD:
            return RunPodProvider(
                key, URL[name], transport=transport, retry=retry, graphql_url="https://runpod.fake/graphql"
            )
        if name is ProviderName.VAST:
            return VastProvider(key, URL[name], transport=transport, retry=retry)
        unpaced = Pacer(0.0, 0.0)  # Lambda's rate limits are tested on a manual clock (test_lambda); here only slow
        return LambdaProvider(key, URL[name], transport=transport, retry=retry, ssh_for=cloud.ssh_for, pacer=unpaced)  # type: ignore[attr-defined]

    def _count(self, kind: str) -> None:
        self.outcome.faults[kind] = self.outcome.faults.get(kind, 0) + 1

    # -- the faults ----------------------------------------------------------------------------------------------

    def queue_call_faults(self) -> None:
        """Random faults at the providers' calls: creates, looks, lists, terminates, the catalogs."""
        for name, cloud in self.clouds.items():
            method, create = CREATE[name]
            for _ in range(self.rng.randint(0, 2)):
                kind, after = self.rng.choice(
                    [
                        (FaultKind.SERVER_ERROR, True),
                        (FaultKind.TIMEOUT, True),
                        (FaultKind.DROP, False),
                        (FaultKind.RATE_LIMIT, False),
                        (FaultKind.SERVER_ERROR, False),
                        (FaultKind.TIMEOUT, False),
                    ]
                )
                cloud.fail_next(method, create, CallFault(kind, after_acting=after, status=self.rng.choice([502, 504])))
                self._count(f"create {kind.value}{' after acting' if after else ''}")
            if self.rng.random() < 0.5:
                cloud.fail_next("GET", r".", CallFault(FaultKind.SLOW, delay=self.rng.uniform(0.2, 1.5)), times=3)
                self._count("slow provider")
            if self.rng.random() < 0.5:
                cloud.fail_next(
                    "GET",
                    r".",
                    CallFault(self.rng.choice([FaultKind.SERVER_ERROR, FaultKind.DROP])),
                    times=self.rng.randint(1, 3),
                )
                self._count("failing look or list")
            if self.rng.random() < 0.4:
                cloud.faults.failing_terminates += self.rng.randint(1, 12)
                self._count("failing terminate")
            if name is not ProviderName.LAMBDA and self.rng.random() < 0.3:
                cloud.faults.outbid_after = self.rng.uniform(0.1, 1.0)
                self._count("outbid")

    def take_a_machine_away(self) -> None:
        """A machine preempted or lost at a random provider (the provider's doing, not Rentune's)."""
        name = self.rng.choice(list(self.clouds))
        cloud = self.clouds[name]
        with cloud.lock:
            live = [i for i in cloud.instances.values() if i.live and i.running_since is not None]
            if not live:
                return
            instance = self.rng.choice(live)
            if self.rng.random() < 0.5:
                cloud.stop_instance(instance, outbid=True)
                self._count("preempted")
            else:
                instance.extra["lost"] = True
                cloud.terminate_instance(instance)
                self._count("lost machine")

    # -- running -------------------------------------------------------------------------------------------------

    def create_runs(self) -> list[str]:
        """The schedule's runs, each on a random provider (spot where it is sold), some with a budget."""
        engine = RunEngine(RunStore(), SecretStore(), EngineOptions())
        ids = []
        for _ in range(self.runs):
            name = self.rng.choice(list(ProviderName))
            spot = name is not ProviderName.LAMBDA and self.rng.random() < 0.5
            others = tuple(p.value for p in ProviderName if p is not name)
            compute = ComputeSpec(
                name.value, gpu=GPU[name], spot=spot, providers=others, idle_minutes=1.0, ready_timeout_minutes=0.5
            )
            spec = RunSpec("org/tiny-model", self.train, None, {"max_steps": 4}, None, 0.0, compute=compute)
            ids.append(engine.create(spec).id)
        return ids

    def run(self) -> Outcome:
        """Runs the schedule and checks the invariants."""
        run_ids = self.create_runs()
        self.queue_call_faults()
        deadline = time.monotonic() + SCHEDULE_LIMIT_S
        generation = 0
        while True:
            generation += 1
            process = Process(self, f"rentune-{self.seed}-{generation}")
            if generation == 1 and self.rng.random() < 0.4:
                name = self.rng.choice(list(ProviderName))
                process.kill_after = CREATE[name]
                self._count("killed right after a create took effect")
            work = process.submit(self._drive_all(process, run_ids))
            kill_at = time.monotonic() + self.rng.uniform(0.2, 3.0) if generation <= 2 else None
            if kill_at is not None and process.kill_after is None:
                self._count("killed at a random moment")
            if self._wait(process, work, kill_at, deadline):
                break
            self.outcome.kills += 1
            process.bury()
            self.room.forget_process(process.name)
            for run_id in run_ids:  # the kernel let go of the dead process's locks
                for lock in (DRIVER_LOCK_NAME, RENTING_LOCK_NAME):
                    with contextlib.suppress(FileNotFoundError):
                        (process.engine.folder(run_id) / lock).unlink()
            if time.monotonic() > deadline:
                self.outcome.violations.append(f"seed {self.seed}: the runs did not end in {SCHEDULE_LIMIT_S:g} s")
                self.outcome.log += process.lines[-40:]
                store = RunStore()
                self.outcome.log += [f"run {r}: {store.get(r).state.value} {store.get(r).error or ''}" for r in run_ids]
                break
        self.settle_as_a_next_start()
        self.check(run_ids)
        return self.outcome

    def _wait(
        self, process: Process, work: concurrent.futures.Future[Any], kill_at: float | None, deadline: float
    ) -> bool:
        """Waits for the process's work; True when it ended on its own, False when it was killed."""
        took_away = False
        while not work.done():
            now = time.monotonic()
            if process.killed.is_set() or (kill_at is not None and now >= kill_at):
                process.kill()
                return False
            if not took_away and self.rng.random() < 0.02:
                self.take_a_machine_away()
                took_away = True
            if now > deadline:
                process.kill()
                process.thread.join(5)
                self.outcome.log += stuck_tasks(process)
                return False
            time.sleep(0.05)
        process.stop()
        with contextlib.suppress(Exception):
            work.result()
        return not process.killed.is_set()

    async def _drive_all(self, process: Process, run_ids: list[str]) -> None:
        await settle_rentals(
            process.engine.store,
            None,
            ledger=process.driver.ledger,
            open=lambda name, _s: self.client(name, process),
            terminator=process.driver.terminator,
            patience=1.0,
        )
        live = [r for r in run_ids if process.engine.store.get(r).state not in ENDED]
        results = await asyncio.gather(*(process.driver.drive(r) for r in live), return_exceptions=True)
        for run_id, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                process.lines.append(f"{run_id}: {result!r}")

    def settle_as_a_next_start(self) -> None:
        """A last start with every fault cleared: it settles what the schedule left."""
        for cloud in self.clouds.values():
            with cloud.lock:
                cloud.faults.queued.clear()
                cloud.faults.failing_terminates = 0
                cloud.faults.outbid_after = None
        process = Process(self, f"rentune-{self.seed}-last")
        work = process.submit(
            settle_rentals(
                process.engine.store,
                None,
                ledger=process.driver.ledger,
                open=lambda name, _s: self.client(name, process),
                terminator=process.driver.terminator,
            )
        )
        work.result(60)
        process.stop()

    # -- the invariants ------------------------------------------------------------------------------------------

    def check(self, run_ids: list[str]) -> None:
        """The three invariants, each break one line in the outcome."""
        ledger, mine = Ledger(), installation_id()
        rows = {(r.provider, r.instance_id): r for r in ledger.rentals() if r.instance_id is not None}
        self.outcome.rentals = len(rows)
        for name, cloud in self.clouds.items():
            for instance in cloud.live_instances():
                row = rows.get((name.value, instance.id))
                label = parse_label(row.label) if row is not None and row.label else None
                ours = label is not None and label.belongs_to(mine)
                if row is None or row.state not in BILLING_STATES or not ours:
                    state = "no row" if row is None else row.state.value
                    self.outcome.violations.append(f"seed {self.seed}: {name.value} {instance.id} runs ({state})")
            for (provider, _instance), row in rows.items():
                if provider == name.value and row.stopped is not None:
                    self._check_dollars(cloud, row)
        self._check_adapters(run_ids)

    def _check_dollars(self, cloud: FakeCloud, row: Any) -> None:
        """Booked dollars against billed ones: within 1 %, except where the provider took the machine away and
        reported no end time: then the ledger's estimated end (when Rentune saw it gone) may be later, never earlier,
        by at most the time it takes to notice (a few polls, slow answers included)."""
        billed = cloud.billed_seconds(row.instance_id) * row.price_per_hour / 3600
        booked = row.usd(time.time())
        skew = (ROUND_TRIP_S if row.end_estimated else CLOCK_SKEW_S) * row.price_per_hour / 3600
        instance = cloud.instances.get(row.instance_id)
        taken = instance is not None and (instance.stopped is not None or instance.extra.get("lost"))
        kind = "noticed" if taken and row.end_estimated else "estimated" if row.end_estimated else "reported"
        self.outcome.gaps.append(((booked - billed) * 3600 / row.price_per_hour, kind))
        if taken and row.end_estimated:
            self.outcome.estimated_ends += 1
            late = booked - billed
            if -skew <= late <= NOTICE_S * row.price_per_hour / 3600:
                return
        # 1 %, or the few milliseconds between the fake's clock reading and the app's around one in-process call
        # (a rental killed right after its create lasts a fraction of a second here, hours in life), or for an end
        # the provider did not report, one terminate's round trip.
        elif abs(booked - billed) <= max(0.01 * billed, skew):
            return
        self.outcome.violations.append(
            f"seed {self.seed}: {row.provider} {row.instance_id} booked ${booked:.6f}, billed ${billed:.6f}"
            + (" (end estimated)" if row.end_estimated else "")
        )

    def _check_adapters(self, run_ids: list[str]) -> None:
        store = RunStore()
        for run_id in run_ids:
            record = store.get(run_id)
            adapter = Path(record.adapter or "") / "adapter_model.safetensors"
            if record.state is RunState.FINISHED and not adapter.is_file():
                self.outcome.violations.append(f"seed {self.seed}: run {run_id} finished but its adapter is gone")


def run_schedule(seed: int, runs: int = 4) -> Outcome:
    """Runs one schedule in a fresh ``RENTUNE_HOME`` with an in-memory keyring."""
    with tempfile.TemporaryDirectory(prefix=f"rentune-soak-{seed}-") as folder:
        root = Path(folder)
        previous = os.environ.get("RENTUNE_HOME")
        os.environ["RENTUNE_HOME"] = str(root / "home")
        os.environ["HF_HUB_OFFLINE"] = "1"  # the runs' model is made up: never ask the Hub about it
        keyring.set_keyring(MemoryKeyring())
        banner = rental_driver.ssh_banner
        rental_driver.ssh_banner = _always_greets  # type: ignore[assignment]
        try:
            return Schedule(seed, root, runs).run()
        finally:
            rental_driver.ssh_banner = banner  # type: ignore[assignment]
            if previous is None:
                os.environ.pop("RENTUNE_HOME", None)
            else:
                os.environ["RENTUNE_HOME"] = previous


async def _always_greets(_host: str, _port: int, time_limit: float = 5.0) -> bool:
    return True
