"""The money soak: schedules of Rentune processes renting and driving runs through the real provider clients against
the fakes of RunPod, Vast.ai and Lambda served in-process, under faults and kills, and the invariants renting keeps.

The fakes' machines are in-memory hosts (no sshd) whose trainer finishes after a while. Two kinds of schedule:

* a seeded random schedule (:func:`run_schedule`): one process drives a few runs at once; faults are injected at every
  kind of call (5xx answers and timeouts after the provider acted, 429s, dropped connections, slow answers, terminates
  that keep failing) and by the providers (spot machines outbid, machines preempted or lost); the process is killed
  at a random moment or right after a create took effect, and restarted;
* a kill sweep (:func:`run_sweep`): one run per process, fault-free, each process killed after its n-th provider call
  or its n-th state write (ledger rows, run state and spec), for every n a rental's life has (:func:`census` counts
  them in a run without kills), then restarted.

A kill freezes the process where it stands (:mod:`tests.soak.processes`). While a schedule runs, the invariants of
:mod:`tests.soak.invariants` are checked every :data:`CHECK_EVERY_S`; at its end everything settles as a next start
would (faults cleared), and they are checked once more with the dollars and the adapters.

``python -m tests.soak`` runs the long soak (``make soak``); the tests run a short set.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keyring

from desktop.core.runs.spec import ComputeSpec, RunSpec
from desktop.services.billing.ledger import Ledger
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import installation_id
from desktop.services.providers.base import Provider, ProviderName
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.lambda_cloud import LambdaProvider, Pacer
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.providers.vast import VastProvider
from desktop.services.renting import driver as rental_driver
from desktop.services.renting.creating import CreateUnsettledError
from desktop.services.renting.reconcile import RENTING_LOCK_NAME, settle_rentals
from desktop.services.runs.context import DRIVER_LOCK_NAME, ENDED
from desktop.services.runs.engine import EngineOptions, RunBusyError, RunEngine
from desktop.services.runs.store import RunStore
from tests.fakes.http import FakeCloud
from tests.fakes.lambda_cloud import FakeLambda
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.soak.faults import clear_faults, fired_kinds, queue_call_faults, take_a_machine_away
from tests.soak.invariants import BillingWatch, check_dollars, lost_adapters
from tests.soak.machines import CloudPool, MachineRoom
from tests.soak.processes import (
    SETTLE_EVERY_S,
    TERMINATE_PATIENCE_S,
    KillPoint,
    KillSwitchTransport,
    Process,
    step_name,
    stuck_tasks,
)

#: The GPU each fake sells that runs ask for.
GPU = {ProviderName.RUNPOD: "RTX 4090", ProviderName.VAST: "RTX 4090", ProviderName.LAMBDA: "A10"}
#: Where each client finds its fake (the in-process transport ignores the host).
URL = {
    ProviderName.RUNPOD: "https://runpod.fake/v2",
    ProviderName.VAST: "https://vast.fake/api/v0",
    ProviderName.LAMBDA: "https://lambda.fake/api/v1",
}
#: Seconds a schedule may take before it counts as stuck (itself a failure).
SCHEDULE_LIMIT_S = 90.0
#: Seconds between two checks of the billing invariant while a schedule runs.
CHECK_EVERY_S = 0.1
#: The chance, at each turn of a schedule's loop (about 50 a second), that a provider takes a running machine away.
TAKE_AWAY_CHANCE = 0.01
#: Seconds a sweep's trainer takes (short: the fewer polls a rental's life has, the fewer kill points to sweep).
SWEEP_TRAINER_S = 0.3
#: Processes a sweep schedule runs at once (each its own run and kill point): more load the loop latency past
#: the estimated ends' tolerance (one terminate's round trip).
SWEEP_LANES = 8
#: What a drive may raise: a drive otherwise ends in a run state the user can act on. The provider cannot be asked
#: now (retried at every start); another process holds the run (in a sweep, another lane's process settling every
#: run's rentals at that moment), said as such to the user, who starts it again.
EXPECTED_RAISES = (CreateUnsettledError, RunBusyError)
#: Minutes a machine may do nothing before the idle guard lets it go: a soak machine's trainer takes seconds, and a
#: process restarted after a kill sometimes reattaches to a trainer that already ended and waits this long.
IDLE_MINUTES = 0.1
#: the final pull: the end window of a rental's life starts here.
PULLING = "run -> pulling"


@dataclass
class Outcome:
    """What one schedule did and found.

    Attributes:
        name: The schedule (its seed, or its kill points).
        rentals: Machines the fakes made.
        faults: Faults that fired, by kind.
        kills: Processes killed and restarted, by kill point.
        missed: Kill points a process never reached (its work ended first).
        checks: Times the billing invariant was checked while the schedule ran.
        violations: Invariant breaks (empty: none).
        log: What the processes said, when the schedule got stuck.
        estimated_ends: Machines the provider took away without an end time (checked for lateness).
        gaps: Per machine, booked minus billed seconds, and how its end was known.
        unknowable: Machines never booked that no client could know of (lost before any answer named them).
        lives: Per lane whose first process ran to its end without a kill point: its provider calls and state writes,
            in order.
    """

    name: str
    rentals: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    missed: int = 0
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    estimated_ends: int = 0
    gaps: list[tuple[float, str]] = field(default_factory=list)
    unknowable: list[str] = field(default_factory=list)
    lives: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Plan:
    """How one process of a lane dies: at a kill point, after some seconds, or not at all."""

    point: KillPoint | None = None
    after_s: float | None = None


class Lane:
    """Runs driven by one process after another: when one is killed, the next starts (as the user would restart).

    Args:
        schedule: The schedule it belongs to.
        name: Its processes' name.
        run_ids: The runs it drives.
        plans: How its first processes die (later ones live).
    """

    def __init__(self, schedule: Schedule, name: str, run_ids: list[str], plans: list[Plan]) -> None:
        self.schedule, self.name, self.run_ids, self.plans = schedule, name, run_ids, plans
        self.generation = 0
        self.done = False
        self.process: Process | None = None
        self.work: concurrent.futures.Future[Any] | None = None
        self.kill_at: float | None = None
        self.kills: list[str] = []

    def step(self) -> None:
        """Starts a process, buries a killed one, or ends the lane when its work is done."""
        if self.done:
            return
        if self.process is None:
            self._start()
        elif self.process.killed.is_set() or (self.kill_at is not None and time.monotonic() >= self.kill_at):
            self._bury(self.process)
        elif self.work is not None and self.work.done():
            self._finish(self.process)

    def _start(self) -> None:
        plan = self.plans[self.generation] if self.generation < len(self.plans) else Plan()
        self.generation += 1
        name = f"{self.name}-{self.generation}"
        process = Process(name, self.schedule.client, self.schedule.room.connector(name), plan.point)
        self.process = process
        self.work = process.submit(self.schedule.drive_all(process, self.run_ids))
        self.kill_at = None if plan.after_s is None else time.monotonic() + plan.after_s

    def _bury(self, process: Process) -> None:
        process.kill()
        process.bury()
        self.schedule.room.forget_process(process.name)
        for run_id in self.run_ids:  # the kernel let go of the dead process's locks
            for lock in (DRIVER_LOCK_NAME, RENTING_LOCK_NAME):
                with contextlib.suppress(FileNotFoundError):
                    (process.engine.folder(run_id) / lock).unlink()
        self.kills.append(_kill_words(process))
        self.schedule.outcome.kills[self.kills[-1]] += 1
        self.process = None

    def _finish(self, process: Process) -> None:
        if process.kill_point is not None:
            self.schedule.outcome.missed += 1
        else:
            self.schedule.outcome.lives[self.name] = list(process.trail)
        process.stop()
        assert self.work is not None
        with contextlib.suppress(Exception):
            self.work.result()
        self.done = True

    def stop_stuck(self) -> None:
        """Past the deadline: the process is killed and where its tasks waited is logged."""
        if self.process is not None:
            self.process.kill()
            self.process.thread.join(5)
            self.schedule.outcome.log += stuck_tasks(self.process) + self.process.lines[-40:]
        self.done = True


def _with_kills(line: str, lanes: list[Lane]) -> str:
    """A break, with how the processes of the run it names were killed."""
    kills = [kill for lane in lanes if any(run_id in line for run_id in lane.run_ids) for kill in lane.kills]
    return f"{line} [killed {', '.join(kills)}]" if kills else line


def _kill_words(process: Process) -> str:
    """The kill point a process died at, for the tally."""
    point = process.kill_point
    if not process.died_at:
        return "at a random moment"
    if point is None or point.kind == "create":
        return "right after a create took effect"
    counted = f" after {point.after}" if point.after else ""
    return f"after {'provider call' if point.kind == 'call' else 'state write'} {point.what} #{point.n}{counted}"


class Schedule:
    """One schedule: the fakes, the runs, the lanes of processes driving them, then the invariants.

    Args:
        name: What the outcome is called.
        root: A fresh folder for the fakes and the training data.
        rng: The schedule's randomness.
        trainer_seconds: How long a machine's trainer takes (drawn from this range).
    """

    def __init__(
        self, name: str, root: Path, rng: random.Random, trainer_seconds: tuple[float, float] = (0.3, 2.0)
    ) -> None:
        self.rng = rng
        self.outcome = Outcome(name)
        self.room = MachineRoom(self.rng, self.outcome.violations, trainer_seconds)
        self.clouds: dict[ProviderName, FakeCloud] = {
            ProviderName.RUNPOD: FakeRunPod(root / "runpod", boot_seconds=0.2),
            ProviderName.VAST: FakeVast(root / "vast", boot_seconds=0.2),
            ProviderName.LAMBDA: FakeLambda(root / "lambda", boot_seconds=0.2, limits=None),  # see client()
        }
        for name, cloud in self.clouds.items():
            cloud.pool = CloudPool(self.room, cloud, name)  # type: ignore[assignment]
        self.train = root / "train.jsonl"
        self.train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
        self.takes_machines_away = False
        self.settles_in_background = False

    def client(self, name: ProviderName, process: Process) -> Provider:
        """A real client of ``name`` talking to its fake through the process's kill switch."""
        cloud = self.clouds[name]
        transport = KillSwitchTransport(cloud.transport(), process, cloud)
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

    def create_run(self, name: ProviderName, *, spot: bool = False, budget: float = 0.0) -> str:
        """A run renting at ``name`` (any other provider allowed for later machines)."""
        others = tuple(p.value for p in ProviderName if p is not name)
        compute = ComputeSpec(
            name.value,
            gpu=GPU[name],
            spot=spot,
            providers=others,
            idle_minutes=IDLE_MINUTES,
            ready_timeout_minutes=0.5,
        )
        spec = RunSpec("org/tiny-model", self.train, None, {"max_steps": 4}, None, budget, compute=compute)
        return RunEngine(RunStore(), SecretStore(), EngineOptions()).create(spec).id

    # -- running -------------------------------------------------------------------------------------------------

    def run(self, lanes: list[Lane]) -> Outcome:
        """Drives the lanes to their end while checking the billing invariant, settles, checks everything."""
        run_ids = [run_id for lane in lanes for run_id in lane.run_ids]
        watch = BillingWatch(self.clouds, installation_id(), run_ids)
        deadline, next_check = time.monotonic() + SCHEDULE_LIMIT_S, 0.0
        while not all(lane.done for lane in lanes):
            for lane in lanes:
                lane.step()
            if self.takes_machines_away and self.rng.random() < TAKE_AWAY_CHANCE:
                take_a_machine_away(self.rng, self.clouds)
            if time.monotonic() >= next_check:
                watch.check()
                next_check = time.monotonic() + CHECK_EVERY_S
            if time.monotonic() > deadline:
                self._stuck(lanes, run_ids)
            time.sleep(0.02)
        self.settle_as_a_next_start()
        watch.after_final_settle()
        self.outcome.checks = watch.checks
        self.outcome.violations += watch.breaks
        self._check_books(run_ids)
        self.outcome.violations = [_with_kills(line, lanes) for line in self.outcome.violations]
        return self.outcome

    def _stuck(self, lanes: list[Lane], run_ids: list[str]) -> None:
        self.outcome.violations.append(f"{self.outcome.name}: the runs did not end in {SCHEDULE_LIMIT_S:g} s")
        for lane in lanes:
            lane.stop_stuck()
        store = RunStore()
        self.outcome.log += [f"run {r}: {store.get(r).state.value} {store.get(r).error or ''}" for r in run_ids]

    async def drive_all(self, process: Process, run_ids: list[str]) -> None:
        """A process's work: settle what earlier ones left, then drive its live runs (settling in the background)."""
        await self._settle(process)
        background = asyncio.ensure_future(self._settle_now_and_then(process)) if self.settles_in_background else None
        live = [r for r in run_ids if process.engine.store.get(r).state not in ENDED]
        results = await asyncio.gather(*(process.driver.drive(r) for r in live), return_exceptions=True)
        if background is not None:
            background.cancel()
        for run_id, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                process.lines.append(f"{run_id}: {result!r}")
            if isinstance(result, BaseException) and not isinstance(result, EXPECTED_RAISES):
                self.outcome.violations.append(f"{process.name}: driving run {run_id} raised {result!r}")

    async def _settle_now_and_then(self, process: Process) -> None:
        """As the app does for its life: rentals left ``creating`` or ``terminating`` are settled again and again."""
        while True:
            await asyncio.sleep(SETTLE_EVERY_S)  # first: a start's drivers take their runs' locks at once
            await self._settle(process)

    async def _settle(self, process: Process) -> None:
        await settle_rentals(
            process.engine.store,
            None,
            ledger=process.driver.ledger,
            open=process.open_client,
            terminator=process.driver.terminator,
            patience=TERMINATE_PATIENCE_S,
        )

    def settle_as_a_next_start(self) -> None:
        """A last start with every fault cleared: it settles what the schedule left."""
        clear_faults(self.clouds)
        process = Process(f"{self.outcome.name}-last", self.client, self.room.connector("last"))
        try:
            process.submit(self._settle(process)).result(60)
        except Exception as exc:  # noqa: BLE001 - a settle that fails is a break of its own, not the soak's end
            self.outcome.violations.append(f"the final settle failed: {exc!r}")
        process.stop()

    def _check_books(self, run_ids: list[str]) -> None:
        """The dollars and the adapters; the tallies of what fired."""
        dollars = check_dollars(self.clouds, Ledger())
        self.outcome.violations += dollars.breaks + lost_adapters(run_ids)
        self.outcome.gaps, self.outcome.estimated_ends = dollars.gaps, dollars.estimated_ends
        self.outcome.unknowable = dollars.unknowable
        self.outcome.faults = fired_kinds(self.clouds)
        self.outcome.rentals = sum(len(cloud.instances) for cloud in self.clouds.values())
        self.outcome.violations = [f"{self.outcome.name}: {line}" for line in self.outcome.violations]


# -- the two kinds of schedule -----------------------------------------------------------------------------------


def random_schedule(schedule: Schedule, runs: int) -> list[Lane]:
    """Runs on random providers (spot where sold), random faults queued, machines taken away; one lane, its first
    process killed at a random moment or right after a create took effect, its second at a random moment."""
    rng = schedule.rng
    run_ids, renting = [], set()
    for _ in range(runs):
        name = rng.choice(list(ProviderName))
        run_ids.append(schedule.create_run(name, spot=name is not ProviderName.LAMBDA and rng.random() < 0.5))
        renting.add(name)
    queue_call_faults(rng, schedule.clouds, renting)
    schedule.takes_machines_away = schedule.settles_in_background = True
    first = Plan(KillPoint("create")) if rng.random() < 0.4 else Plan(after_s=rng.uniform(0.2, 3.0))
    return [Lane(schedule, schedule.outcome.name, run_ids, [first, Plan(after_s=rng.uniform(0.2, 3.0))])]


def sweep_lanes(schedule: Schedule, points: list[tuple[ProviderName, KillPoint | None]]) -> list[Lane]:
    """One run and one lane per point: its first process dies there (None: lives), the next finishes the run.

    Fault-free, so no terminate is left for a background settle: each process's calls and writes are its own run's
    alone (a background settle would also settle the rows of another lane's killed process).
    """
    lanes = []
    for index, (name, point) in enumerate(points):
        run_id = schedule.create_run(name)
        lanes.append(Lane(schedule, f"{schedule.outcome.name}-{index}", [run_id], [Plan(point)]))
    return lanes


@contextlib.contextmanager
def soak_home(prefix: str) -> Iterator[Path]:
    """A fresh ``RENTUNE_HOME`` and in-memory keyring; SSH banners always greet (the machines are in memory)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        root = Path(folder)
        previous = os.environ.get("RENTUNE_HOME")
        os.environ["RENTUNE_HOME"] = str(root / "home")
        os.environ["HF_HUB_OFFLINE"] = "1"  # the runs' model is made up: never ask the Hub about it
        keyring.set_keyring(MemoryKeyring())
        banner = rental_driver.ssh_banner
        rental_driver.ssh_banner = _always_greets  # type: ignore[assignment]
        try:
            yield root
        finally:
            rental_driver.ssh_banner = banner  # type: ignore[assignment]
            if previous is None:
                os.environ.pop("RENTUNE_HOME", None)
            else:
                os.environ["RENTUNE_HOME"] = previous


def run_schedule(seed: int, runs: int = 4) -> Outcome:
    """Runs the random schedule of ``seed``."""
    with soak_home(f"rentune-soak-{seed}-") as root:
        schedule = Schedule(f"seed {seed}", root, random.Random(seed))
        return schedule.run(random_schedule(schedule, runs))


def run_sweep_batch(name: str, points: list[tuple[ProviderName, KillPoint | None]]) -> Outcome:
    """Runs one sweep schedule: one fault-free run per point, each on its own process killed there."""
    with soak_home("rentune-sweep-") as root:
        schedule = Schedule(name, root, random.Random(name), (SWEEP_TRAINER_S, SWEEP_TRAINER_S))
        return schedule.run(sweep_lanes(schedule, points))


def census(providers: tuple[ProviderName, ...] = tuple(ProviderName), lives: int = 2) -> dict[ProviderName, list[str]]:
    """The longest fault-free rental life at each provider (of ``lives`` each): its provider calls and state writes."""
    points: list[tuple[ProviderName, KillPoint | None]] = [(name, None) for name in providers for _ in range(lives)]
    outcome = run_sweep_batch("census", points)
    if outcome.violations or len(outcome.lives) != len(points):
        raise AssertionError("the census run broke: " + "\n".join(outcome.violations + outcome.log))
    longest: dict[ProviderName, list[str]] = {}
    for index, (name, _none) in enumerate(points):
        trail = outcome.lives[f"census-{index}"]
        if len(trail) > len(longest.get(name, [])):
            longest[name] = trail
    return longest


def sweep_points(
    lives: dict[ProviderName, list[str]], *, money_only: bool = False
) -> list[tuple[ProviderName, KillPoint | None]]:
    """The kill points of each provider's rental life: after each of its calls and after each of its state writes.

    ``money_only``: only those of its two windows where a kill can leave a machine billing: from its first step until
    just after the machine is recorded (``ledger.created``), and from the final pull to its end.
    """
    points: list[tuple[ProviderName, KillPoint | None]] = []
    for name, trail in lives.items():
        kept = _money_steps(trail) if money_only else range(len(trail))
        pulling = trail.index(PULLING) if PULLING in trail else len(trail)
        for index in sorted(kept):
            after = PULLING if index >= pulling else None  # the end window's steps are counted from the final pull
            start = pulling if after else 0
            what = step_name(trail[index])
            n = sum(1 for step in trail[start : index + 1] if step_name(step) == what)
            points.append((name, KillPoint("call" if is_call(trail[index]) else "write", n, what, after)))
    return points


def is_call(step: str) -> bool:
    """Whether a step of a life is a provider call (``GET /v2/pods/1002``) rather than a state write."""
    return step.split(" ", 1)[0].isupper()


def _money_steps(trail: list[str]) -> set[int]:
    """The steps of a life from its start to just after ``ledger.created``, and from the final pull to its end."""
    created = trail.index("ledger.created") + 1 if "ledger.created" in trail else len(trail)
    pulling = trail.index(PULLING) if PULLING in trail else len(trail)
    return set(range(created + 1)) | set(range(pulling, len(trail)))


def run_sweep(points: list[tuple[ProviderName, KillPoint | None]], lanes: int = SWEEP_LANES) -> Iterator[Outcome]:
    """Runs the kill points, ``lanes`` processes at a time; yields each batch's outcome."""
    for first in range(0, len(points), lanes):
        yield run_sweep_batch(f"sweep {first // lanes + 1}", points[first : first + lanes])


async def _always_greets(_host: str, _port: int, time_limit: float = 5.0) -> bool:
    return True
