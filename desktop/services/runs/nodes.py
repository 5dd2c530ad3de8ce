"""A run across several machines: the head (rank 0) is the run; every other machine is a node record beside it.

The head's record is what the user sees and what the engine follows: its events, checkpoints and adapter, as on
one machine. Each other machine has a record of its own (``RUN.n1``, ``RUN.n2``: its target, pinned host key, own
SSH key, remote folder and trainer pid), so logging in, uploading, preparing and starting a trainer there are the
single-machine steps. :class:`Nodes` drives those records beside the head: prepares them in parallel with it,
starts their trainers, watches that each is still there, and stops or ends them with the run. A node lost (its
machine unreachable past the grace period, or its trainer gone without finishing) pauses the whole run with every
node stopped: nothing bills for half a cluster, and a resume continues from the newest checkpoint at home.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

from desktop.core.runs.states import RunState
from desktop.services.machines.failures import MACHINE_ERRORS, PermanentError, classify
from desktop.services.machines.machine import Machine
from desktop.services.runs import connection, launch, monitor, run_keys, transfer
from desktop.services.runs.checkpoints import PART_MARKER_LIMIT, CheckpointPart, PartMissingError, part_files
from desktop.services.runs.cluster import cluster_of
from desktop.services.runs.context import ENDED, RunContext, quietly_close
from desktop.services.runs.store import RunRecord
from trainer_payload.protocol import CHECKPOINT_MARKER, TRAINER_EXIT_FILE_NAME, sharded_checkpoints

#: Exit codes of a node's trainer that are no loss: done, or stopped on SIGTERM with the others (checkpoint saved).
FINISHED_EXITS = frozenset({0, 143})
#: Seconds a trainer asked to stop (SIGTERM) may take before its processes are killed.
STOP_WAIT_SECONDS = 20.0
#: Seconds a node's part of a checkpoint may take to be sealed there after the head's (its first rank seals it).
PART_WAIT_SECONDS = 60.0
# Shell: kills a process and all its descendants (the trainer, accelerate's launcher and its ranks) at once.
_KILL_TREE = (
    "kill_tree() { for c in $(cat /proc/$1/task/*/children 2>/dev/null); do kill_tree $c; done; "
    "kill -KILL $1 2>/dev/null; }; kill_tree {pid}; true"
)
_T = TypeVar("_T")


class Nodes:
    """The other machines of a run across several, driven beside its head (rank 0)."""

    def __init__(self, ctx: RunContext, head_id: str) -> None:
        """Follows the nodes of the run ``head_id`` (none for a run on one machine)."""
        self.ctx, self.head_id = ctx, head_id
        self.ids = [record.id for record in ctx.store.nodes_of(head_id)]
        self.machines: dict[str, Machine] = {}
        self._unreachable_since: dict[str, float] = {}
        training = ctx.store.get(head_id).spec.get("training") or {}
        #: Each node's part of a checkpoint is needed to resume from it (a full fine-tune's shards), not only welcome.
        self.parts_needed = sharded_checkpoints(str(training.get("method", "")), str(training.get("strategy", "")))

    def __bool__(self) -> bool:
        return bool(self.ids)

    def name(self, node_id: str) -> str:
        """``node 1 (ssh://user@host:port)``, for messages."""
        record = self.ctx.store.get(node_id)
        return f"node {cluster_of(record).get('node_rank', '?')} ({record.target})"

    async def machine(self, node_id: str) -> Machine:
        """The node's open connection, logging in (host key pinned, the run's key installed) when there is none."""
        machine = self.machines.get(node_id)
        if machine is None:
            machine = self.machines[node_id] = await connection.connect(self.ctx, node_id, install_key=True)
        return machine

    async def _each(self, work: Callable[[str], Awaitable[_T]]) -> list[_T]:
        """Runs ``work`` on every node at once; the first failure is raised once all have ended."""
        results = await asyncio.gather(*(work(node_id) for node_id in self.ids), return_exceptions=True)
        for node_id, result in zip(self.ids, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, MACHINE_ERRORS):
                    self.ctx.report(f"{self.name(node_id)}: {classify(result).message}")
                    await self.drop(node_id)
                raise result
        return [result for result in results if not isinstance(result, BaseException)]

    async def prepare(self) -> str | None:
        """Uploads to and prepares every node at once (each follows a trainer it already runs); why one failed."""
        problems = await self._each(self._prepare)
        return next((problem for problem in problems if problem), None)

    async def _prepare(self, node_id: str) -> str | None:
        machine = await self.machine(node_id)
        record = await launch.adopt_trainer(self.ctx, node_id, machine)
        if record.pid is not None:
            return None
        started = await launch.started_bootstrap(machine, record)
        if started is None:
            await transfer.upload(self.ctx, node_id, machine)
        problem = await launch.bootstrap(self.ctx, node_id, machine, started)
        return f"{self.name(node_id)}: {problem}" if problem else None

    async def adopt(self) -> None:
        """After a reconnect: logs in to every node and follows the trainer running there, if any."""
        await self._each(self._adopt)

    async def _adopt(self, node_id: str) -> None:
        await launch.adopt_trainer(self.ctx, node_id, await self.machine(node_id))

    async def start_trainers(self) -> None:
        """Starts the trainer on every node that runs none (they wait for the head at its address)."""
        await self._each(self._start_trainer)

    async def _start_trainer(self, node_id: str) -> None:
        if self.ctx.store.get(node_id).pid is None:
            await launch.launch(self.ctx, node_id, await self.machine(node_id))

    async def parts(self, path: str, known: Collection[str]) -> list[CheckpointPart]:
        """Every node's files of the checkpoint at ``out/<path>`` beyond ``known`` (the head's), from its own seal.

        A full fine-tune's sharded checkpoint needs every node's part. An adapter's needs none (each node adds only
        its ranks' RNG states, which make a resume repeat the same random draws): a node out of reach then leaves its
        part out, said in a line.

        Raises:
            PartMissingError: A needed part is not sealed in time, or its machine is out of reach.
            PermanentError: A node sent a damaged seal or an unsafe name.
        """
        asked = [self._part(node_id, path, known) for node_id in self.ids]
        results = await asyncio.gather(*asked, return_exceptions=True)
        found = []
        for node_id, result in zip(self.ids, results, strict=True):
            if isinstance(result, CheckpointPart):
                found.append(result)
                continue
            if isinstance(result, PermanentError) or not isinstance(result, MACHINE_ERRORS):
                raise result
            await self.drop(node_id)
            cause = str(result) if isinstance(result, PartMissingError) else classify(result).message
            why = f"{self.name(node_id)}: its part of {path} cannot be had ({cause})"
            if self.parts_needed:
                raise PartMissingError(why) from result
            self.ctx.report(f"{why}; the checkpoint comes home without it (its ranks' RNG states)")
        return found

    async def _part(self, node_id: str, path: str, known: Collection[str]) -> CheckpointPart:
        record = self.ctx.store.get(node_id)
        machine = await self.machine(node_id)
        remote = f"{record.remote_dir}/out/{path}"
        deadline = time.monotonic() + PART_WAIT_SECONDS
        while (seal := await machine.read_from(f"{remote}/{CHECKPOINT_MARKER}", 0, PART_MARKER_LIMIT)) is None:
            if time.monotonic() > deadline:
                raise PartMissingError(f"it was not sealed there within {PART_WAIT_SECONDS:.0f} s")
            await asyncio.sleep(min(1.0, self.ctx.options.poll_seconds))
        return CheckpointPart(machine, remote, part_files(seal, known))

    async def align_checkpoints(self) -> None:
        """Puts the newest checkpoint at home, and no other, on every node (before the trainers start again)."""
        await self._each(self._align)

    async def _align(self, node_id: str) -> None:
        await transfer.align_checkpoints(self.ctx, node_id, await self.machine(node_id))

    async def lost(self, grace_seconds: float | None = None) -> str | None:
        """Why a node is lost, or None while every node trains (or has finished).

        A node is lost when its machine has not answered for ``grace_seconds`` (the engine's grace period by
        default; 0 when the head already failed and the cause is wanted now), or its trainer is gone without
        finishing.
        """
        grace = self.ctx.options.grace_seconds if grace_seconds is None else grace_seconds
        for node_id in self.ids:
            why = await self._lost(node_id, grace)
            if why is not None:
                return f"{self.name(node_id)} {why}"
        return None

    async def _lost(self, node_id: str, grace: float) -> str | None:
        record = self.ctx.store.get(node_id)
        try:
            machine = await self.machine(node_id)
            if record.pid is None or await monitor.alive(machine, record):
                self._unreachable_since.pop(node_id, None)
                return None
            code = await trainer_exit_code(machine, record)
        except MACHINE_ERRORS as exc:
            await self.drop(node_id)
            since = self._unreachable_since.setdefault(node_id, time.monotonic())
            if time.monotonic() - since < grace:
                return None
            return f"is unreachable ({classify(exc).message})"
        self._unreachable_since.pop(node_id, None)
        if code in FINISHED_EXITS:
            return None
        return "lost its trainer (its processes are gone)" if code is None else f"had its trainer fail (exit {code})"

    async def stop_trainers(self) -> None:
        """Stops every node's trainer that can be reached: asked first (SIGTERM), killed when it does not end."""
        await asyncio.gather(*(self._stop_trainer(node_id) for node_id in self.ids))

    async def _stop_trainer(self, node_id: str) -> None:
        record = self.ctx.store.get(node_id)
        if record.pid is None:
            return
        try:
            await stop_trainer(await self.machine(node_id), record, self.ctx.options.poll_seconds)
        except MACHINE_ERRORS as exc:
            await self.drop(node_id)
            self.ctx.report(f"{self.name(node_id)} could not be stopped now ({classify(exc).message})")

    async def pause(self, why: str) -> None:
        """The run paused: every node's trainer is stopped and its record paused (a resume starts them again)."""
        await self.stop_trainers()
        for node_id in self.ids:
            self.ctx.store.update(node_id, pid=None, error=why)
            if self.ctx.store.get(node_id).state is not RunState.PAUSED:
                self.ctx.store.transition(node_id, RunState.PAUSED, why)

    async def end(self, state: RunState, why: str) -> None:
        """The run ended: each node's trainer stopped, its uploaded data and the run's key removed, its record ended.

        A node that cannot be reached now keeps its key recorded (removed at the next contact, listed by
        ``rentune doctor``).
        """
        await asyncio.gather(*(self._end(node_id) for node_id in self.ids))
        for node_id in self.ids:
            if self.ctx.store.get(node_id).state not in ENDED:
                self.ctx.store.transition(node_id, state, why)

    async def _end(self, node_id: str) -> None:
        record = self.ctx.store.get(node_id)
        try:
            machine = self.machines.get(node_id) or await connection.connect(self.ctx, node_id, 10, install_key=False)
            self.machines[node_id] = machine
            if record.pid is not None:
                await stop_trainer(machine, record, self.ctx.options.poll_seconds)
            if record.remote_dir:
                await machine.run(f"rm -rf {shlex.quote(record.remote_dir)}/data", check=False)
            await run_keys.release_key(self.ctx, node_id, machine)
        except MACHINE_ERRORS as exc:
            self.ctx.report(f"{self.name(node_id)} was not reached to clean up ({classify(exc).message})")

    async def drop(self, node_id: str) -> None:
        """Forgets a node's connection (it failed); the next use logs in again."""
        machine = self.machines.pop(node_id, None)
        if machine is not None:
            await quietly_close(machine)

    async def close(self) -> None:
        """Closes every node's connection."""
        for node_id in list(self.machines):
            await self.drop(node_id)


async def trainer_exit_code(machine: Machine, record: RunRecord) -> int | None:
    """The exit code the node's trainer wrote as it ended, or None (killed, or not ended; the machine is untrusted)."""
    path = shlex.quote(f"{record.remote_dir}/out/{TRAINER_EXIT_FILE_NAME}")
    text = (await machine.run(f"cat {path} 2>/dev/null || true")).strip()
    return int(text) if text.isdigit() and len(text) <= 3 else None


async def stop_trainer(machine: Machine, record: RunRecord, poll_seconds: float) -> None:
    """Asks a trainer to stop (SIGTERM: it saves and exits); kills it and its ranks when it has not ended in time.

    A rank waiting on a lost peer never answers SIGTERM: it blocks in its gradient exchange.
    """
    if not await monitor.alive(machine, record):
        return
    await machine.run(f"kill -TERM {int(record.pid or 0)} 2>/dev/null || true")
    if not await monitor.until_exited(machine, record, poll_seconds, STOP_WAIT_SECONDS):
        await machine.run(_KILL_TREE.replace("{pid}", str(int(record.pid or 0))))
