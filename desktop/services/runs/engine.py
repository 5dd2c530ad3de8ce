"""The run engine: drives a fine-tune on a machine and brings the adapter home, surviving disconnects.

States (persisted before each transition): planned → connecting → uploading → bootstrapping → training → syncing →
pulling → finished, plus paused (machine unreachable or lost), failed and cancelled. ``drive`` continues a run from
wherever it stands, so the app or CLI can die at any point and pick the run up again.

This module holds the drive loop and the public API; connecting (:mod:`.connection`, :mod:`.run_keys`), the upload
(:mod:`.transfer`), starting the trainer (:mod:`.launch`), following it (:mod:`.monitor`) and bringing work home
(:mod:`.checkpoints`) live beside it. Machines are reached through the ``connect`` it is given (SSH by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shlex
from collections.abc import AsyncIterator, Awaitable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from desktop.core.data.formats import objective_data_problem
from desktop.core.runs.spec import RunSpec, SshTarget
from desktop.core.runs.states import TERMINAL, RunState
from desktop.services.data.reader import DatasetFileError, first_format
from desktop.services.machines.failures import MACHINE_ERRORS, Backoff, PermanentError, classify
from desktop.services.machines.keys import create_run_key, delete_run_key, load_run_key
from desktop.services.machines.machine import Connect, Machine
from desktop.services.machines.ssh import fingerprint
from desktop.services.platform.logs import get_logger
from desktop.services.platform.secrets import SecretName, SecretStore, probe_secret_store
from desktop.services.platform.tasks import cancel_and_wait
from desktop.services.runs import (
    bucket_courier,
    checkpoints,
    connection,
    launch,
    monitor,
    nodes,
    remote_export,
    run_keys,
    self_stop,
    serve_on_machine,
    transfer,
)
from desktop.services.runs.actions import resume_refusal
from desktop.services.runs.bucket_checkpoints import keep_in_bucket, stays_in_bucket
from desktop.services.runs.bucket_data import bucket_of_settings
from desktop.services.runs.cluster import CLUSTER_KEY, cluster_of
from desktop.services.runs.context import (
    DRIVER_LOCK_NAME,
    ENDED,
    EngineOptions,
    Report,
    RunContext,
    quietly_close,
)
from desktop.services.runs.errors import RunBusyError, RunError
from desktop.services.runs.events import final_event, newest_checkpoint_only
from desktop.services.runs.fit_advice import oom_advice
from desktop.services.runs.machine_logs import bring_log_home, with_log
from desktop.services.runs.nodes import Nodes
from desktop.services.runs.overrun_check import judge_calibration
from desktop.services.runs.store import RunRecord, RunStore
from trainer_payload.protocol import (
    CheckpointEvent,
    DoneEvent,
    ErrorEvent,
    ErrorKind,
    Event,
    EventKind,
    JobState,
    StateEvent,
    StopCause,
)

#: Seconds between two looks at the self-stop heartbeat while a pull runs (it is touched at its own pace).
PULL_HEARTBEAT_POLL_S = 15.0
_log = get_logger("engine")

__all__ = [
    "DRIVER_LOCK_NAME",
    "ENDED",
    "EngineOptions",
    "Report",
    "RunBusyError",
    "RunEngine",
    "RunError",
    "spec_to_record",
]


def spec_to_record(spec: RunSpec) -> dict[str, Any]:
    """The parts of a spec a run needs later, JSON-ready (paths as strings, no secrets)."""
    return {
        "base_model": spec.base_model,
        "train_file": str(spec.train_file),
        "eval_file": str(spec.eval_file) if spec.eval_file else None,
        "training": spec.training,
        "python": spec.target.python if spec.target else "python3",
        "identity": str(spec.target.identity) if spec.target and spec.target.identity else None,
        "workdir": spec.target.workdir if spec.target else None,
        "authorized_keys": spec.target.authorized_keys if spec.target else None,
        "hourly_rate_usd": spec.hourly_rate_usd,
        "budget_usd": spec.budget_usd,
        "source": str(spec.source) if spec.source else None,
        "compute": asdict(spec.compute) if spec.compute else None,
        **({"predicted": dict(spec.estimate)} if spec.estimate else {}),
        **({"export_on_machine": list(spec.export_on_machine)} if spec.export_on_machine else {}),
        **({"serve": spec.serve.to_dict()} if spec.serve else {}),
        **({"judge_on_machine": spec.judge.to_dict()} if spec.judge else {}),
        **bucket_of_settings(),
    }


def _check_objective_fits_data(spec: RunSpec) -> None:
    """Refuses, before anything is rented, training data the objective cannot train on (pairs for SFT, chats for DPO).

    Raises:
        RunError: The training file's first row is of another kind than the objective trains on.
    """
    try:
        fmt = first_format(spec.train_file)
    except DatasetFileError as exc:
        raise RunError(f"{exc}; check [data] train in the spec") from exc
    problem = objective_data_problem(str(spec.training.get("objective", "sft")), fmt) if fmt else ""
    if problem:
        raise RunError(f"{spec.train_file.name}: {problem}")


class RunEngine:
    """Drives runs recorded in a :class:`RunStore`."""

    def __init__(
        self,
        store: RunStore | None = None,
        secrets: SecretStore | None = None,
        options: EngineOptions | None = None,
        report: Report | None = None,
        *,
        connect: Connect = connection.ssh_connect,
    ) -> None:
        """Creates an engine.

        Args:
            store: Where runs are recorded (the app's by default).
            secrets: Where the Hugging Face token is read from.
            options: Timing and limits.
            report: Receives one line per thing the user should know.
            connect: Logs in to a machine (SSH by default).
        """
        self.ctx = RunContext(
            store or RunStore(),
            secrets or SecretStore(),
            options or EngineOptions(),
            report or (lambda _line: None),
            connect,
        )
        self.store, self.secrets, self.report = self.ctx.store, self.ctx.secrets, self.ctx.report
        self._total_steps: dict[str, int] = {}  # each run's optimizer steps in all, as its trainer last said
        self._nodes: dict[str, Nodes] = {}  # the other machines of each run being driven (none on one machine)

    @property
    def options(self) -> EngineOptions:
        """Timing and limits; a new value applies from the next poll."""
        return self.ctx.options

    @options.setter
    def options(self, options: EngineOptions) -> None:
        self.ctx.options = options

    # -- creating and addressing runs ----------------------------------------------------------------------------

    def create(self, spec: RunSpec) -> RunRecord:
        """Records a new run for a spec (nothing is contacted yet)."""
        if spec.target is None and spec.compute is None:
            raise RunError(
                "the spec says neither where to train nor what to rent: add [target] ssh = ... (or pass --target "
                "ssh://user@host:port), or a [compute] table"
            )
        if not spec.train_file.is_file():
            raise RunError(f"{spec.train_file} does not exist; check [data] train in the spec")
        _check_objective_fits_data(spec)
        self._check_tracker_keys(spec)
        if spec.target is None:
            return self._create_rented(spec)
        pinned = connection.pinned_fingerprint(spec.target)
        record = self.store.create(spec_to_record(spec), spec.target.url)
        if pinned is not None:  # pinned in advance (the wizard's Test connection): any other key is refused
            record = self.store.update(record.id, host_key=spec.target.host_key, fingerprint=pinned)
        public = create_run_key(record.id)
        record = self.ctx.set_spec(record.id, run_key_public=public, run_key_installed=False)
        if spec.nodes:
            record = self._create_nodes(record, spec)
        where = " and ".join(target.url for target in (spec.target, *spec.nodes))
        self.report(f"run {record.id} created for {spec.base_model} on {where}")
        return record

    def _check_tracker_keys(self, spec: RunSpec) -> None:
        """Refuses, before anything is rented, a run reporting to W&B without a usable W&B key.

        Raises:
            RunError: The key is missing, or its environment variable cannot be used; the message says the fix.
        """
        if "wandb" not in spec.training.get("report_to", []):
            return
        status = self.ctx.secrets.status(SecretName.WANDB)
        if not status.usable:
            why = status.problem or "no Weights & Biases API key is set"
            raise RunError(
                f"the run reports to W&B ([tracking] report_to) but {why}: save the key on the Settings page, "
                "run `rentune keys set wandb`, or set WANDB_API_KEY; or remove wandb from report_to"
            )

    def _create_nodes(self, head: RunRecord, spec: RunSpec) -> RunRecord:
        """Records the other machines of a run across several: each its own target, host key and run key."""
        assert spec.head_address is not None
        cluster = {"num_nodes": spec.num_nodes, "head_address": spec.head_address, "head_port": spec.head_port}
        for rank, node in enumerate(spec.nodes, start=1):
            record = self.store.create(
                {**spec_to_record(spec), CLUSTER_KEY: {**cluster, "node_rank": rank, "head": head.id}},
                node.url,
                node_of=head.id,
                rank=rank,
            )
            self.ctx.set_spec(record.id, run_key_public=create_run_key(record.id), run_key_installed=False)
        return self.ctx.set_spec(head.id, **{CLUSTER_KEY: {**cluster, "node_rank": 0}})

    def _create_rented(self, spec: RunSpec) -> RunRecord:
        """Records a run whose machine is rented for it: no target yet; the provider is given the run's key."""
        record = self.store.create(spec_to_record(spec), None)
        public = create_run_key(record.id)
        if public is None:  # nothing was rented: the record goes again
            self.ctx.end(record.id, RunState.CANCELLED, "no keyring for the run's SSH key")
            self.store.delete(record.id)
            raise RunError(
                "renting needs a keyring that keeps the run's own SSH key (its private half is kept nowhere else): "
                f"{_keyring_problem()}; or use [target] with your own key"
            )
        record = self.ctx.set_spec(record.id, run_key_public=public, run_key_installed=False)
        provider = spec.compute.provider if spec.compute else "?"
        nodes = spec.compute.nodes if spec.compute else 1
        if nodes > 1:
            record = self._create_rented_nodes(record, spec, nodes)
        machines = f"a cluster of {nodes} machines" if nodes > 1 else "a machine"
        self.report(f"run {record.id} created for {spec.base_model}, to train on {machines} rented at {provider}")
        return record

    def _create_rented_nodes(self, head: RunRecord, spec: RunSpec, nodes: int) -> RunRecord:
        """Records the other machines of a rented cluster: no target until it is up, the head's key to log in.

        The provider puts one key on every machine of a cluster: the run's (the head's), which the nodes use.
        """
        # A port of the run's own (a cluster's machines are the run's alone; a port per run keeps runs apart anyway).
        port = 29501 + int(hashlib.sha256(head.id.encode()).hexdigest(), 16) % 2000
        cluster = {"num_nodes": nodes, "head_address": None, "head_port": port}
        for rank in range(1, nodes):
            self.store.create(
                {
                    **spec_to_record(spec),
                    CLUSTER_KEY: {**cluster, "node_rank": rank, "head": head.id},
                    "rented_node": True,
                },
                None,
                node_of=head.id,
                rank=rank,
            )
        return self.ctx.set_spec(head.id, **{CLUSTER_KEY: {**cluster, "node_rank": 0}})

    def place_rented_nodes(self, run_id: str, targets: list[tuple[SshTarget, str]], head_address: str) -> RunRecord:
        """Points a rented run's machines at a cluster that is up: the head first, each with its pinned host key.

        Args:
            run_id: The run (its head).
            targets: One (target, host key) per machine, in rank order.
            head_address: Where the others reach the head (its address on the cluster's private network).
        """
        records = [self.store.get(run_id), *self.store.nodes_of(run_id)]
        for record, (target, host_key) in zip(records, targets, strict=True):
            # The cluster keys first: whoever sees the new target sees where its head now is.
            placed = {**cluster_of(record), "head_address": head_address}
            self.ctx.set_spec(record.id, **{CLUSTER_KEY: placed})
            self.retarget(record.id, target, rented=True, host_key=host_key)
        return self.store.get(run_id)

    def retarget(
        self, run_id: str, target: SshTarget, *, rented: bool = False, host_key: str | None = None
    ) -> RunRecord:
        """Points a run at another machine (the old one is lost); its work continues from the last checkpoint.

        Args:
            run_id: The run.
            target: The new machine.
            rented: The machine was rented for the run and already lets the run's key in.
            host_key: The machine's host key, pinned now (None: pinned on first contact).
        """
        record = self.store.get(run_id)
        spec = {
            **record.spec,
            "run_key_installed": rented,  # a new machine of the user's gets the run's key on first contact
            "python": target.python,
            "workdir": target.workdir or record.spec.get("workdir"),
            "authorized_keys": target.authorized_keys,
            "identity": str(target.identity) if target.identity else record.spec.get("identity"),
        }
        # One statement: the target, the spec and the per-machine fields change together.
        pinned = fingerprint(host_key) if host_key else None
        return self.store.update(
            run_id, target=target.url, spec=spec, host_key=host_key, fingerprint=pinned, pid=None, remote_dir=None
        )

    def retarget_nodes(self, run_id: str, targets: list[SshTarget]) -> RunRecord:
        """Points a run across several machines at a fresh set, one target per machine, the head first.

        The other machines reach the new head at its SSH host name.

        Raises:
            RunError: Not one target per machine of the run.
        """
        cluster, others = cluster_of(self.store.get(run_id)), self.store.nodes_of(run_id)
        if len(targets) != 1 + len(others):
            raise RunError(
                f"run {run_id} trains on {1 + len(others)} machines: give --target once per machine, the head first"
            )
        placed = {**cluster, "head_address": targets[0].host}
        for record, target in zip([self.store.get(run_id), *others], targets, strict=True):
            rank = cluster_of(record).get("node_rank", 0)
            self.ctx.set_spec(record.id, **{CLUSTER_KEY: {**cluster_of(record), **placed, "node_rank": rank}})
            self.retarget(record.id, target)  # last: whoever sees the new target sees its cluster keys
        return self.store.get(run_id)

    def delete(self, run_id: str) -> None:
        """Deletes an ended run's files, record and key, unless some process follows it right now.

        Raises:
            RunBusyError: The app or a ``rentune resume`` follows the run (it may just have been resumed).
            RunLiveError: The run is live or paused.
        """
        lock = self.ctx.driver_lock(run_id)
        others = [record.id for record in self.store.nodes_of(run_id)]
        try:
            self.store.delete(run_id)
        finally:
            lock.release()
        for key_of in [run_id, *others]:
            if not self.store.installed_keys(run_id=key_of):
                delete_run_key(key_of)  # a key still on a machine keeps its private half until it is removed there

    def prepare_resume(self, run_id: str) -> RunRecord:
        """Lets a failed or stopped run start its trainer again (from its newest checkpoint) when the user resumes it.

        A stopped run is reopened: it becomes paused, so driving it reconnects (or rents a new machine) and the
        trainer continues from the newest checkpoint there or, on a new machine, the newest one on this computer.
        Blocking: a rented run whose own SSH key was forgotten when it ended gets a new one from the keyring.

        Raises:
            RunError: The run cannot be resumed (finished, stopped at its budget, no keyring for a rented run's
                key); the message says why.
        """
        record = self.store.get(run_id)
        refusal = resume_refusal(record)
        if record.state in TERMINAL and refusal is not None:  # a live run is simply followed again
            raise RunError(f"run {run_id} cannot be resumed: {refusal}")
        if record.state in {RunState.FAILED, RunState.CANCELLED}:
            spec = {key: value for key, value in record.spec.items() if key != "stop_requested"}
            record = self.store.update(run_id, pid=None, relaunches=0, error=None, spec=_with_run_key(run_id, spec))
        if record.state is RunState.CANCELLED:
            record = self.store.transition(run_id, RunState.PAUSED, "resumed from the newest checkpoint", reopen=True)
        for node in self.store.nodes_of(run_id):  # every machine of the run takes it up again
            self.store.update(node.id, pid=None, error=None)
            if node.state in {RunState.CANCELLED, RunState.FAILED}:
                self.store.transition(node.id, RunState.PAUSED, "resumed with the run", reopen=True)
        return record

    def folder(self, run_id: str) -> Path:
        """The run's local folder."""
        return self.store.folder(run_id)

    # -- driving ---------------------------------------------------------------------------------------------------

    async def drive(self, run_id: str) -> RunRecord:
        """Continues a run until it is finished, failed, cancelled or paused; returns its final record.

        Raises:
            RunBusyError: Another Rentune process (the app or a detached CLI) is driving this run.
        """
        record = self.store.get(run_id)
        if record.state in TERMINAL:
            return record
        lock = self.ctx.driver_lock(run_id)
        try:
            outcome = await self._settle_nodes(await self._drive_locked(run_id))
            if outcome.state in ENDED:
                await bucket_courier.withdraw(self.ctx, run_id)
            return outcome
        finally:
            lock.release()

    async def _settle_nodes(self, outcome: RunRecord) -> RunRecord:
        """Brings a run's other machines to where the run now stands: stopped or cleaned up with it.

        Paused: every trainer stopped (nothing trains, or bills, on part of a cluster); ended: cleaned up.
        """
        others = Nodes(self.ctx, outcome.id)
        if not others or outcome.state not in {*ENDED, RunState.PAUSED}:
            return outcome
        try:
            if outcome.state is RunState.PAUSED:
                await others.pause(outcome.error or "the run paused")
            else:
                await others.end(outcome.state, f"the run {outcome.state.value}")
        finally:
            await others.close()
        return self.store.get(outcome.id)

    async def _drive_locked(self, run_id: str) -> RunRecord:
        """Sessions on the machine until the run ends or pauses; passing failures are retried with backoff."""
        backoff = self.ctx.backoffs[run_id] = Backoff(self.options.poll_seconds, self.options.grace_seconds)
        try:
            while True:
                try:
                    return await self._session(run_id)
                except MACHINE_ERRORS as exc:
                    verdict = classify(exc)
                    if verdict.permanent:
                        return self.ctx.fail(run_id, verdict.message)
                    delay = backoff.next_delay()
                    if delay is None:
                        unreachable = f"machine unreachable for {backoff.failing_for():.0f} s ({verdict.message})"
                        return self.ctx.pause(run_id, unreachable)
                    self.report(f"cannot reach the machine ({verdict.message}); retrying in {delay:.1f} s")
                    await asyncio.sleep(delay)
        finally:
            self.ctx.backoffs.pop(run_id, None)

    async def _session(self, run_id: str) -> RunRecord:
        """One connection: works the run until it ends or pauses; its key comes off the machine when it ends.

        Raises:
            OSError, asyncssh.Error, RemoteError: The connection failed in a way reconnecting may fix.
        """
        if self.store.get(run_id).state in {RunState.PLANNED, RunState.PAUSED}:
            self.store.transition(run_id, RunState.CONNECTING)  # only driving moves a run; pull and logs look
        machine = await connection.connect(self.ctx, run_id, install_key=True)
        self._nodes[run_id] = Nodes(self.ctx, run_id)
        try:
            try:
                outcome = await self._on_machine(run_id, machine)
            except MACHINE_ERRORS as exc:
                verdict = classify(exc)
                if not verdict.permanent:
                    raise
                outcome = self.ctx.fail(run_id, verdict.message)
            if outcome.state in ENDED:
                await run_keys.release_key(self.ctx, run_id, machine)
            return outcome
        finally:
            await self._nodes.pop(run_id).close()
            await quietly_close(machine)

    async def _on_machine(self, run_id: str, machine: Machine) -> RunRecord:
        """Gets the trainer going (upload, bootstrap, launch, or adopting one already running), then follows it."""
        record, others = self.store.get(run_id), self._nodes[run_id]
        if record.pid is None:
            record = await launch.adopt_trainer(self.ctx, run_id, machine)
        if record.pid is None:
            problem = await _first_problem(self._prepare_head(run_id, machine), others.prepare())
            if problem is not None:
                return self.ctx.fail(run_id, problem)
            await launch.launch(self.ctx, run_id, machine)
            await others.start_trainers()
        elif not await launch.workdir_exists(machine, record):
            return self.ctx.pause(
                run_id,
                "machine lost: the remote work folder is gone; resume with --target to "
                "continue from the newest local checkpoint",
            )
        elif others:
            await _first_problem(others.prepare())  # a node's trainer followed, or (after a lost launch) started
            await others.start_trainers()
        await self_stop.ensure_self_stop(self.ctx, run_id, machine)
        if not others:
            await bucket_courier.rearm(self.ctx, run_id, machine)
        if self.store.get(run_id).state is RunState.SERVING:  # reconnected, or restarted: serving goes on
            return await self._serve(run_id, machine)
        if self.store.get(run_id).state in {RunState.SYNCING, RunState.PULLING}:
            # The final pull was under way when the last driver went (a crash, a kill): finish it now instead of
            # waiting for news from a trainer that has already said its last word.
            final = await asyncio.to_thread(final_event, self.folder(run_id))
            if final is not None:
                outcome = await self._handle(run_id, machine, final)
                if outcome is not None:
                    return outcome
        return await self._monitor(run_id, machine)

    async def _prepare_head(self, run_id: str, machine: Machine) -> str | None:
        """Uploads to the run's machine and prepares it (detached); why that failed, or None when ready."""
        started = await launch.started_bootstrap(machine, self.store.get(run_id))
        if started is None:  # a reconnect follows the bootstrap already started: no new upload, no second one
            await transfer.upload(self.ctx, run_id, machine)
        return await launch.bootstrap(self.ctx, run_id, machine, started)

    async def _node_lost(self, run_id: str, machine: Machine, why: str) -> RunRecord:
        """One machine of a run across several is lost: every trainer stops and the run pauses.

        Its newest checkpoint is home; a resume continues from it on the same machines or on a fresh set.
        """
        await machine.run("true")  # the head itself gone: its own grace period and pause, not blamed on a node
        last_words = await monitor.read_events(self.ctx, run_id, machine) or []
        outcome = await self._handle_all(run_id, machine, newest_checkpoint_only(last_words))
        if outcome is not None:  # the head had finished (or failed) meanwhile: that is how the run ends
            return outcome
        record = self.store.get(run_id)
        if record.pid is not None:
            with contextlib.suppress(*MACHINE_ERRORS):
                await nodes.stop_trainer(machine, record, self.options.poll_seconds)
        with contextlib.suppress(*MACHINE_ERRORS, RunError):
            await checkpoints.pull_newest_checkpoint(self.ctx, run_id, machine, self._nodes.get(run_id))
        self.store.update(run_id, pid=None)
        newest = checkpoints.newest_local_checkpoint(self.folder(run_id) / "checkpoints")
        home = f"{newest.name} is home" if newest else "no checkpoint had been written"
        count = 1 + len(self._nodes[run_id].ids)
        return self.ctx.pause(
            run_id,
            f"{why}: every machine was stopped ({home}); rentune resume {run_id} continues on the same machines, "
            f"or with --target once per machine ({count}, the head first) on a fresh set",
        )

    async def _monitor(self, run_id: str, machine: Machine) -> RunRecord:
        """Reads and acts on events until the run ends; a trainer that died silently is relaunched."""
        while True:
            events = await monitor.read_events(self.ctx, run_id, machine)
            if events is None and not await launch.workdir_exists(machine, self.store.get(run_id)):
                return self.ctx.pause(run_id, "machine lost: the remote work folder is gone")
            self.ctx.made_progress(run_id)
            outcome = await self._handle_all(run_id, machine, newest_checkpoint_only(events or []))
            if outcome is not None:
                return outcome
            lost = await self._nodes[run_id].lost() if self._nodes[run_id] else None
            if lost is not None:
                return await self._node_lost(run_id, machine, lost)
            if not events and not await monitor.alive(machine, self.store.get(run_id)):
                relaunched = await self._relaunch(run_id, machine)
                if relaunched is not None:
                    return relaunched
            await monitor.stop_if_over_budget(self.ctx, run_id, machine)
            await self_stop.heartbeat(self.ctx, run_id, machine, self.ctx.heartbeats)
            await asyncio.sleep(self.options.poll_seconds)

    async def _handle_all(self, run_id: str, machine: Machine, events: list[Event]) -> RunRecord | None:
        """Acts on events in order; returns the run's record once one of them ends the run."""
        for event in events:
            outcome = await self._handle(run_id, machine, event)
            if outcome is not None:
                return outcome
        return None

    async def _handle(self, run_id: str, machine: Machine, event: Event) -> RunRecord | None:
        if event["event"] is EventKind.STEP and event.get("total_steps"):
            self._total_steps[run_id] = int(event.get("total_steps") or 0)
        elif event["event"] is EventKind.CALIBRATION and self._total_steps.get(run_id):
            await judge_calibration(self.ctx, run_id, machine, event, self._total_steps[run_id])
        elif event["event"] is EventKind.CHECKPOINT:
            async with self._heartbeat_while_pulling(run_id, machine):
                await self._keep_checkpoint(run_id, machine, event)
        elif event["event"] is EventKind.DONE:
            return await self._finish(run_id, machine, event)
        elif event["event"] is EventKind.ERROR:
            advice = await self._oom_advice(run_id, event) if event["kind"] == ErrorKind.OOM else None
            words = f"{event['kind']}: {event['message']} — {event.get('hint')}"
            self.store.update(run_id, error=f"{words.rstrip('.')}. {advice}" if advice else words)
            if advice:
                self.ctx.set_spec(run_id, oom_advice=advice)  # the monitor says it as what to do
        elif event["event"] is EventKind.STATE and event["state"] == JobState.FAILED:
            return await self._on_failed(run_id, machine, event)
        return None

    async def _keep_checkpoint(self, run_id: str, machine: Machine, event: CheckpointEvent) -> None:
        """Brings a new checkpoint home, then sends it to the run's bucket (one machine, a bucket set up).

        Home first, as without a bucket: the machine rotates old checkpoints away, and the home copy is the one every
        guarantee rests on. A full fine-tune's checkpoint goes to the bucket alone while it pushes fine (too large to
        pull home while training); when it cannot go there, it comes home.
        """
        others = self._nodes.get(run_id)
        total, poll = self._total_steps.get(run_id), self.options.poll_seconds
        if others or not stays_in_bucket(self.store.get(run_id).spec):
            await checkpoints.pull_checkpoint(self.ctx, run_id, machine, event, others)
            if not others:
                await keep_in_bucket(self.ctx, run_id, machine, event, total=total, poll=poll)
        elif not await keep_in_bucket(self.ctx, run_id, machine, event, total=total, poll=poll):
            await checkpoints.pull_checkpoint(self.ctx, run_id, machine, event, others)

    async def _oom_advice(self, run_id: str, event: ErrorEvent) -> str | None:
        """What would fit with the memory the run measured (the plan made again), or None; never fails the run."""
        try:
            return await asyncio.to_thread(
                oom_advice, self.store.get(run_id).spec, self.folder(run_id), event.get("peak_gpu_gb"), run_id
            )
        except Exception as exc:  # noqa: BLE001 - advice is a nicety: the error itself is said either way
            _log.warning("no out-of-memory advice for %s: %s", run_id, exc)
            return None

    async def _on_failed(self, run_id: str, machine: Machine, event: StateEvent) -> RunRecord:
        reason = str(event.get("reason", ""))
        if event.get("stopped_by") == StopCause.SIGNAL:
            await checkpoints.pull_newest_checkpoint(self.ctx, run_id, machine, self._nodes.get(run_id))
            if not await monitor.until_exited(machine, self.store.get(run_id), self.options.poll_seconds):
                self.report("the trainer said it stopped but its process is still there; ending the run anyway")
            return monitor.cancel_stopped(self.ctx, run_id, reason)
        others = self._nodes.get(run_id)
        lost = await others.lost(grace_seconds=0) if others else None
        if lost is not None:  # the head failed because another machine went: a pause, resumed on a fresh set
            return await self._node_lost(run_id, machine, lost)
        record = self.store.get(run_id)
        log = await bring_log_home(self.ctx, run_id, machine, launch.TRAINER_LOG)  # before the machine may go
        return self.ctx.fail(run_id, with_log(record.error or reason, log))

    async def _finish(self, run_id: str, machine: Machine, event: DoneEvent) -> RunRecord:
        """Ends a trained run: the newest checkpoint and the adapter come home, the uploaded data is deleted."""
        record = self.store.transition(run_id, RunState.SYNCING)
        async with self._heartbeat_while_pulling(run_id, machine):
            await checkpoints.pull_newest_checkpoint(self.ctx, run_id, machine, self._nodes.get(run_id))
            record = self.store.transition(run_id, RunState.PULLING)
            local = await checkpoints.pull_adapter(self.ctx, run_id, machine, event)
        self.store.update(run_id, adapter=str(local), error=None)
        self.report(f"adapter verified and saved to {local}")
        if record.spec.get("export_on_machine") or record.spec.get("judge_on_machine"):
            async with self._heartbeat_while_pulling(run_id, machine):  # the self-stop waits for the export too
                await remote_export.export_on_machine(self.ctx, run_id, machine)
        await machine.run(f"rm -rf {shlex.quote(str(record.remote_dir))}/data", check=False)  # judged, if asked
        if record.spec.get("serve") and not self.store.get(run_id).spec.get("stop_requested"):
            self.store.transition(run_id, RunState.SERVING)
            return await self._serve(run_id, machine)
        return self.ctx.end(run_id, RunState.FINISHED, f"adapter at {local}")

    async def _serve(self, run_id: str, machine: Machine) -> RunRecord:
        """Serves the tuned model from the machine (``[serve]``) until idle or stopped, then ends the run."""
        async with self._heartbeat_while_pulling(run_id, machine):  # the self-stop ends it once nobody follows
            words = await serve_on_machine.serve_on_machine(self.ctx, run_id, machine)
        self.report(f"serving ended: {words}")
        return self.ctx.end(run_id, RunState.FINISHED, f"adapter at {self.store.get(run_id).adapter}; {words}")

    @contextlib.asynccontextmanager
    async def _heartbeat_while_pulling(self, run_id: str, machine: Machine) -> AsyncIterator[None]:
        """Keeps the machine's self-stop heartbeat fresh while a pull runs: the self-stop must never cut one short."""

        async def beat() -> None:
            while True:
                with contextlib.suppress(*MACHINE_ERRORS):
                    await self_stop.heartbeat(self.ctx, run_id, machine, self.ctx.heartbeats)
                await asyncio.sleep(PULL_HEARTBEAT_POLL_S)

        task = asyncio.ensure_future(beat())
        try:
            yield
        finally:
            await cancel_and_wait(task)

    async def _relaunch(self, run_id: str, machine: Machine) -> RunRecord | None:
        """After the trainer died: acts on its last words, or starts it again (up to the limit)."""
        events = await monitor.read_events(self.ctx, run_id, machine)  # the last words of the trainer, if any
        outcome = await self._handle_all(run_id, machine, events or [])
        if outcome is not None:
            return outcome
        final = await asyncio.to_thread(final_event, self.folder(run_id))
        if final is not None:
            # Read before the app was closed, but not acted on (a stop or the adapter download was cut short):
            # finish that instead of training again.
            return await self._handle(run_id, machine, final)
        record = self.store.get(run_id)
        if record.spec.get("budget_stop") or record.spec.get("overrun_stop") or record.spec.get("stop_requested"):
            # Stopped (for its budget, or by the user) and died before saying so, e.g. a SIGTERM that came before
            # the trainer could catch it: never train on.
            return monitor.cancel_stopped(self.ctx, run_id, "")
        if record.relaunches >= self.options.max_relaunches:
            log = await bring_log_home(self.ctx, run_id, machine, launch.TRAINER_LOG)
            died = f"the trainer died {record.relaunches + 1} times"
            return self.ctx.fail(
                run_id, with_log(died, log) if log else f"{died}; see {launch.TRAINER_LOG} on the machine"
            )
        self.report("the trainer died without a final event; relaunching (it resumes from its checkpoint)")
        others = self._nodes[run_id]
        if others:  # every machine starts again together, from the same checkpoint: the ranks meet afresh at the head
            await others.stop_trainers()
            for node_id in others.ids:
                self.store.update(node_id, pid=None)
            await transfer.align_checkpoints(self.ctx, run_id, machine)
            await others.align_checkpoints()
        await launch.launch(self.ctx, run_id, machine)
        await others.start_trainers()
        # Counted once started: a connection lost mid-launch is retried without using up a relaunch.
        self.store.update(run_id, relaunches=record.relaunches + 1)
        return None

    # -- looking, pulling and stopping ---------------------------------------------------------------------------

    async def pull(self, run_id: str, *, driven_here: bool = False) -> Path | None:
        """Pulls the newest checkpoint now; returns the local folder (None when none was written yet).

        Args:
            run_id: The run.
            driven_here: This engine's :meth:`drive` is following the run, so the event stream is already being
                read; only the newest known checkpoint is fetched (if it is not home yet).

        Raises:
            RunBusyError: Another process follows the run (it pulls every checkpoint as it is written).
            RunError: The machine refused (the login, an unsafe file name); the message says what to do.
        """
        lock = None if driven_here else self.ctx.driver_lock(run_id)
        lent = None if driven_here else self._nodes.setdefault(run_id, Nodes(self.ctx, run_id))
        try:
            machine = await connection.connect_or_explain(self.ctx, run_id)
            try:
                await self._pull_now(run_id, machine, driven_here)
            finally:
                await quietly_close(machine)
        finally:
            if lent is not None and self._nodes.get(run_id) is lent:  # the other machines' parts come too
                await self._nodes.pop(run_id).close()
            if lock is not None:
                lock.release()
        return checkpoints.newest_local_checkpoint(self.folder(run_id) / "checkpoints")

    async def _pull_now(self, run_id: str, machine: Machine, driven_here: bool) -> None:
        try:
            if driven_here:
                await checkpoints.pull_newest_checkpoint(self.ctx, run_id, machine, self._nodes.get(run_id))
                return
            # Act on what is read (a done event finishes the run) so nothing is skipped.
            events = await monitor.read_events(self.ctx, run_id, machine) or []
            outcome = await self._handle_all(run_id, machine, newest_checkpoint_only(events))
            if outcome is None:
                await checkpoints.pull_newest_checkpoint(self.ctx, run_id, machine, self._nodes.get(run_id))
        except PermanentError as exc:
            if not driven_here:
                self.ctx.fail(run_id, str(exc))
                await run_keys.release_key(self.ctx, run_id, machine)
            raise RunError(str(exc)) from exc
        if outcome is not None and outcome.state in ENDED:
            await run_keys.release_key(self.ctx, run_id, machine)

    async def payload_log(self, run_id: str, lines: int = 200) -> str:
        """The last lines of the trainer's own log on the machine (stdout and stderr of the payload)."""
        record = self.store.get(run_id)
        machine = await connection.connect_or_explain(self.ctx, run_id)
        try:
            path = shlex.quote(f"{record.remote_dir}/out/payload.log")
            return await machine.run(f"tail -n {int(lines)} {path} 2>/dev/null || true")
        finally:
            await quietly_close(machine)

    async def stop(self, run_id: str) -> RunRecord:
        """Asks the trainer to save and stop (SIGTERM), pulls that checkpoint, and cancels the run."""
        record = self.store.get(run_id)
        if record.state in TERMINAL:
            return record
        if record.pid is None:
            record = self.ctx.end(run_id, RunState.CANCELLED, "stopped before the trainer started")
            await connection.release_key_now(self.ctx, run_id)
            return await self._settle_nodes(record)
        try:
            await self.request_stop(run_id)
        except MACHINE_ERRORS as exc:
            if record.state is not RunState.PAUSED:
                raise
            why = (
                f"stopped while the machine was unreachable ({type(exc).__name__}); if it still exists, stop it at "
                "your provider. The newest checkpoint on this computer is kept."
            )
            return self.ctx.end(run_id, RunState.CANCELLED, why)
        try:
            return await self.drive(run_id)
        except RunBusyError:
            if record.state is RunState.SERVING:
                self.report("stop requested; the process following this run ends serving, then the machine")
            else:
                self.report("stop requested; the process following this run pulls the checkpoint and ends it")
            return self.store.get(run_id)

    async def request_stop(self, run_id: str) -> None:
        """Sends SIGTERM to the trainer: it saves a checkpoint and exits; whoever drives the run then ends it."""
        record = self.store.get(run_id)
        if record.pid is None:
            return
        self.ctx.set_spec(run_id, stop_requested=True)  # remembered: a trainer that dies of it is not relaunched
        machine = await connection.connect(self.ctx, run_id)
        try:
            if record.state is RunState.SERVING:  # trained and home: the stop ends serving, and the run finishes
                await serve_on_machine.stop_serving(machine, str(record.remote_dir))
            else:
                await machine.run(f"kill -TERM {int(record.pid)} 2>/dev/null || true")
        finally:
            await quietly_close(machine)


async def _first_problem(*steps: Awaitable[str | None]) -> str | None:
    """Runs steps that each return a problem (or None) at once; the first problem, or the first error raised.

    Every step ends before an error is raised: none is left running on its own.
    """
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return next((str(result) for result in results if result), None)


def _keyring_problem() -> str:
    """Why the keyring did not keep a run key, in words with the fix (from a probe of the keyring)."""
    return probe_secret_store().problem or "the keyring refused the key; unlock it and try again"


def _with_run_key(run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A rented run's spec with a run key the provider can be given (the old one went when the run ended).

    Raises:
        RunError: No keyring holds the new key.
    """
    if not spec.get("compute") or load_run_key(run_id) is not None:
        return spec
    public = create_run_key(run_id)
    if public is None:
        raise RunError(
            f"resuming a rented run needs a keyring that keeps the run's new SSH key: {_keyring_problem()}; then "
            "resume again"
        )
    return {**spec, "run_key_public": public, "run_key_installed": False}
