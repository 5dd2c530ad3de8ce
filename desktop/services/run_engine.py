"""The run engine: drives a fine-tune on an SSH machine and brings the adapter home, surviving disconnects.

States (persisted before each transition): planned → connecting → uploading → bootstrapping → training → syncing →
pulling → finished, plus paused (machine unreachable or lost), failed and cancelled. ``drive`` continues a run from
wherever it stands, so the app or CLI can die at any point and pick the run up again.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import asyncssh
import filelock

from desktop.core.runs.progress import cost_so_far
from desktop.core.runs.spec import RunSpec, SshTarget
from desktop.core.runs.states import TERMINAL, RunState
from desktop.core.settings import Settings
from desktop.services.logs import get_logger
from desktop.services.run_keys import (
    DEFAULT_AUTHORIZED_KEYS,
    create_run_key,
    delete_run_key,
    install_command,
    load_run_key,
    remove_command,
)
from desktop.services.run_store import RunRecord, RunStore
from desktop.services.secrets import SecretName, SecretStore, SecretStoreError
from desktop.services.ssh_remote import Endpoint, HostKeyChangedError, RemoteError, RemoteMachine, fingerprint
from trainer_payload.protocol import (
    CHECKPOINT_MARKER,
    EVENTS_FILE_NAME,
    JOB_FILE_NAME,
    VENV_PYTHON,
    EventKind,
    parse_event_lines,
)

Report = Callable[[str], None]
_log = get_logger("engine")
DRIVER_LOCK_NAME = ".driver.lock"
_CONNECTION_ERRORS = (OSError, asyncssh.Error, asyncio.TimeoutError, RemoteError)
#: On the machine, relative to the run's folder: the detached bootstrap's "pid seq" (seq: the last event before it
#: began) and its output.
BOOTSTRAP_MARKER = "out/bootstrap.pid"
BOOTSTRAP_LOG = "out/bootstrap.log"


@dataclass(frozen=True)
class EngineOptions:
    """Timing and limits of the engine.

    Attributes:
        poll_seconds: How often the event stream is read.
        grace_seconds: How long a machine may be unreachable before the run is paused.
        max_relaunches: Relaunches of a trainer that died without a final event.
        keep_local_checkpoints: Pulled checkpoints kept per run.
    """

    poll_seconds: float = 1.0
    grace_seconds: float = 120.0
    max_relaunches: int = 3
    keep_local_checkpoints: int = 3

    def with_settings(self, settings: Settings) -> EngineOptions:
        """These options with the user's preferences applied (how many pulled checkpoints a run keeps)."""
        return replace(self, keep_local_checkpoints=settings.keep_local_checkpoints)


@dataclass(frozen=True)
class _Bootstrap:
    """A bootstrap started on the machine: its process id and the sequence number of the last event before it."""

    pid: int
    after_seq: int


class RunError(RuntimeError):
    """A run cannot go on; the message says why and what to do."""


class RunBusyError(RunError):
    """Another process is already driving the run."""


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
    }


def _pinned_fingerprint(target: SshTarget) -> str | None:
    """The fingerprint of the target's pinned host key (None when none is pinned).

    Raises:
        RunError: The pinned key is not a valid public key.
    """
    if not target.host_key:
        return None
    try:
        return fingerprint(target.host_key)
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise RunError(
            f"[target] host_key is not a valid public key ({exc}); test the connection again or remove the key"
        ) from exc


def _endpoint(record: RunRecord) -> Endpoint:
    if not record.target:
        raise RunError("the run has no target; resume it with --target ssh://user@host:port")
    from desktop.core.runs.spec import parse_ssh_url

    user, host, port = parse_ssh_url(record.target)
    identity = record.spec.get("identity")
    keys: list[Path | asyncssh.SSHKey] = []
    run_key = load_run_key(record.id) if record.spec.get("run_key_installed") else None
    if run_key is not None:
        keys.append(run_key)  # the run's own key first; the user's identity stays as the fallback
    if identity:
        keys.append(Path(identity))
    return Endpoint(host, port, user, tuple(keys))


class RunEngine:
    """Drives runs recorded in a :class:`RunStore`."""

    def __init__(
        self,
        store: RunStore | None = None,
        secrets: SecretStore | None = None,
        options: EngineOptions | None = None,
        report: Report | None = None,
    ) -> None:
        self.store = store or RunStore()
        self.secrets = secrets or SecretStore()
        self.options = options or EngineOptions()
        self.report = report or (lambda _line: None)
        self._pull_lock = asyncio.Lock()

    # -- creating and addressing runs ----------------------------------------------------------------------------

    def create(self, spec: RunSpec) -> RunRecord:
        """Records a new run for a spec (nothing is contacted yet)."""
        if spec.target is None:
            raise RunError("the spec has no [target] ssh = ...; pass --target ssh://user@host:port")
        if not spec.train_file.is_file():
            raise RunError(f"{spec.train_file} does not exist; check [data] train in the spec")
        pinned = _pinned_fingerprint(spec.target)
        record = self.store.create(spec_to_record(spec), spec.target.url)
        if pinned is not None:  # pinned in advance (the wizard's Test connection): any other key is refused
            record = self.store.update(record.id, host_key=spec.target.host_key, fingerprint=pinned)
        public = create_run_key(record.id)
        record = self._set_spec(record.id, run_key_public=public, run_key_installed=False)
        self.report(f"run {record.id} created for {spec.base_model} on {spec.target.url}")
        return record

    def retarget(self, run_id: str, target: SshTarget) -> RunRecord:
        """Points a run at another machine (the old one is lost); its work continues from the last checkpoint."""
        record = self.store.get(run_id)
        spec = {
            **record.spec,
            "run_key_installed": False,  # a new machine gets the run's key on first contact
            "python": target.python,
            "workdir": target.workdir or record.spec.get("workdir"),
            "authorized_keys": target.authorized_keys,
            "identity": str(target.identity) if target.identity else record.spec.get("identity"),
        }
        # One statement: the target, the spec and the per-machine fields change together.
        return self.store.update(
            run_id, target=target.url, spec=spec, host_key=None, fingerprint=None, pid=None, remote_dir=None
        )

    def delete(self, run_id: str) -> None:
        """Deletes an ended run's files, record and key, unless some process follows it right now.

        Raises:
            RunBusyError: The app or a ``rentune resume`` follows the run (it may just have been resumed).
            RunLiveError: The run is live or paused.
        """
        lock = self._driver_lock(run_id)
        try:
            self.store.delete(run_id)
        finally:
            lock.release()
        delete_run_key(run_id)

    def prepare_resume(self, run_id: str) -> RunRecord:
        """Lets a failed run start its trainer again (from its newest checkpoint) when the user resumes it."""
        record = self.store.get(run_id)
        if record.state is RunState.FAILED:
            record = self.store.update(run_id, pid=None, relaunches=0, error=None)
        return record

    def _set_spec(self, run_id: str, **values: Any) -> RunRecord:
        return self.store.update(run_id, spec={**self.store.get(run_id).spec, **values})

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
        lock = self._driver_lock(run_id)
        try:
            return await self._drive_locked(run_id)
        finally:
            lock.release()

    def _driver_lock(self, run_id: str) -> filelock.BaseFileLock:
        """One driver per run across processes: two would relaunch trainers and pull into the same folder."""
        lock = filelock.FileLock(self.folder(run_id) / DRIVER_LOCK_NAME, blocking=False)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise RunBusyError(
                f"run {run_id} is already being followed by another Rentune window or `rentune resume`; "
                "use that one, or close it and try again"
            ) from exc
        return lock

    async def _drive_locked(self, run_id: str) -> RunRecord:
        started, delay = time.monotonic(), self.options.poll_seconds
        while True:
            try:
                machine = await self._connect(run_id)
            except HostKeyChangedError as exc:
                return self._fail(run_id, str(exc))
            except _CONNECTION_ERRORS as exc:
                if time.monotonic() - started > self.options.grace_seconds:
                    return self._pause(run_id, f"machine unreachable for {self.options.grace_seconds:.0f} s ({exc})")
                self.report(f"cannot reach the machine ({type(exc).__name__}); retrying in {delay:.0f} s")
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)  # exponential backoff
                continue
            delay = self.options.poll_seconds
            try:
                return await self._on_machine(run_id, machine)
            except _CONNECTION_ERRORS as exc:
                self.report(f"connection lost ({type(exc).__name__}: {exc}); reconnecting")
                started = time.monotonic()
            finally:
                await _quietly_close(machine)

    async def _connect(self, run_id: str) -> RemoteMachine:
        record = self.store.get(run_id)
        if record.state in {RunState.PLANNED, RunState.PAUSED}:
            record = self.store.transition(run_id, RunState.CONNECTING)
        machine = await RemoteMachine.connect(await asyncio.to_thread(_endpoint, record), record.host_key)
        try:
            return await self._settle_in(run_id, record, machine)
        except BaseException:
            await _quietly_close(machine)  # cancelled or failed half-way: never leave the connection open
            raise

    async def _settle_in(self, run_id: str, record: RunRecord, machine: RemoteMachine) -> RemoteMachine:
        """Pins the host key, switches to the run's own key and finds the remote folder on a fresh connection."""
        if record.host_key is None:
            self.store.update(run_id, host_key=machine.host_key, fingerprint=fingerprint(machine.host_key))
            self.report(f"pinned host key of {record.target}: {fingerprint(machine.host_key)}")
        if await self._install_run_key(run_id, machine):
            await _quietly_close(machine)  # from now on the run logs in with its own key
            endpoint = await asyncio.to_thread(_endpoint, self.store.get(run_id))
            machine = await RemoteMachine.connect(endpoint, machine.host_key)
        if record.remote_dir is None:
            try:
                home = (await machine.run('printf %s "$HOME"')).strip()
            except BaseException:
                await _quietly_close(machine)
                raise
            base = record.spec.get("workdir") or f"{home}/.rentune/runs"
            self.store.update(run_id, remote_dir=f"{base}/{run_id}")
        return machine

    async def _install_run_key(self, run_id: str, machine: RemoteMachine) -> bool:
        """Adds the run's public key to the machine once; True when it was just installed."""
        record = self.store.get(run_id)
        public = record.spec.get("run_key_public")
        if not public or record.spec.get("run_key_installed"):
            return False
        await machine.run(install_command(public, record.spec.get("authorized_keys") or DEFAULT_AUTHORIZED_KEYS))
        self._set_spec(run_id, run_key_installed=True)
        self.report("installed this run's own SSH key on the machine (removed when the run ends)")
        return True

    async def _remove_run_key(self, run_id: str, machine: RemoteMachine) -> None:
        record = self.store.get(run_id)
        public = record.spec.get("run_key_public")
        if public and record.spec.get("run_key_installed"):
            authorized = record.spec.get("authorized_keys") or DEFAULT_AUTHORIZED_KEYS
            await machine.run(remove_command(public, authorized), check=False)
            self._set_spec(run_id, run_key_installed=False)
        delete_run_key(run_id)

    async def _on_machine(self, run_id: str, machine: RemoteMachine) -> RunRecord:
        record = self.store.get(run_id)
        if record.pid is None:
            started = await self._started_bootstrap(machine, record)
            if started is None:  # a reconnect follows the bootstrap already started: no new upload, no second one
                await self._upload(run_id, machine)
            problem = await self._bootstrap(run_id, machine, started)
            if problem is not None:
                return self._fail(run_id, problem)
            await self._launch(run_id, machine)
        elif not await self._workdir_exists(machine, record):
            return self._pause(
                run_id,
                "machine lost: the remote work folder is gone; resume with --target to "
                "continue from the newest local checkpoint",
            )
        return await self._monitor(run_id, machine)

    # -- upload, bootstrap, launch -----------------------------------------------------------------------------

    async def _upload(self, run_id: str, machine: RemoteMachine) -> None:
        record = self.store.transition(run_id, RunState.UPLOADING)
        remote, spec, local = str(record.remote_dir), record.spec, self.folder(run_id)
        files: list[tuple[Path, str]] = [(Path(str(p)), f"payload/trainer_payload/{p.name}") for p in _payload_files()]
        files.append((Path(spec["train_file"]), "data/train.jsonl"))
        if spec.get("eval_file"):
            files.append((Path(spec["eval_file"]), "data/eval.jsonl"))
        model_files = _local_model_files(spec["base_model"])
        files += model_files
        job = {
            "base_model": "model" if model_files else spec["base_model"],
            "train_file": "data/train.jsonl",
            "eval_file": "data/eval.jsonl" if spec.get("eval_file") else None,
            "output_dir": "out",
            **spec["training"],
        }
        (local / JOB_FILE_NAME).write_text(json.dumps(job, indent=2), encoding="utf-8")
        files.append((local / JOB_FILE_NAME, JOB_FILE_NAME))
        files += self._resume_files(run_id)
        for path, relative in files:
            await machine.upload(path, f"{remote}/{relative}", self._progress("upload"))
        self.report(f"uploaded {len(files)} files to {record.target}")

    def _resume_files(self, run_id: str) -> list[tuple[Path, str]]:
        """On a new machine: the newest local checkpoint and the event history, so the payload resumes."""
        local = self.folder(run_id)
        files: list[tuple[Path, str]] = []
        newest = _newest_local_checkpoint(local / "checkpoints")
        if newest is not None:
            files += [
                (p, f"out/checkpoints/{newest.name}/{p.relative_to(newest)}")
                for p in sorted(newest.rglob("*"))
                if p.is_file()
            ]
            self.report(f"resuming from local {newest.name}")
        if (local / EVENTS_FILE_NAME).exists():
            files.append((local / EVENTS_FILE_NAME, f"out/{EVENTS_FILE_NAME}"))
        return files

    def _token_stdin(self, run_id: str) -> str:
        """The stdin line the payload reads HF_TOKEN from: the token only when the model comes from the Hub."""
        if not _model_from_hub(self.folder(run_id), self.store.get(run_id).spec["base_model"]):
            return "\n"  # the model folder travelled with the run: the machine never needs the token
        try:
            token = self.secrets.get(SecretName.HUGGINGFACE) or ""
        except SecretStoreError:
            token = ""
        return token + "\n"

    async def _bootstrap(self, run_id: str, machine: RemoteMachine, started: _Bootstrap | None) -> str | None:
        """Prepares the machine detached and follows it; returns why it failed (the payload's error), None when ready.

        The install and model download can take an hour: detached, they survive a sleeping laptop or a dropped
        connection. A failed install is not a lost connection: retrying it would re-upload and re-install in a loop,
        billing.
        """
        if started is None:
            started = await self._start_bootstrap(run_id, machine)
        elif self.store.get(run_id).state is not RunState.BOOTSTRAPPING:
            self.store.transition(run_id, RunState.BOOTSTRAPPING)
        return await self._follow_bootstrap(run_id, machine, started)

    async def _start_bootstrap(self, run_id: str, machine: RemoteMachine) -> _Bootstrap:
        record = self.store.get(run_id)
        # The old marker goes before the state says bootstrapping, so a reconnect never follows a finished one.
        await machine.run(f"rm -f {shlex.quote(f'{record.remote_dir}/{BOOTSTRAP_MARKER}')}")
        record = self.store.transition(run_id, RunState.BOOTSTRAPPING)
        launch = (
            f"bootstrap {JOB_FILE_NAME} > {BOOTSTRAP_LOG} 2>&1 < /dev/null & "
            f'echo "$! {record.last_seq}" > {BOOTSTRAP_MARKER}; echo $!'
        )
        command = _payload_command(record, launch, detached=True)
        pid = int((await machine.run(command, stdin=await asyncio.to_thread(self._token_stdin, run_id))).strip())
        self.report(f"preparing the machine (pid {pid}): installing the trainer's packages, downloading the model")
        return _Bootstrap(pid, record.last_seq)

    async def _started_bootstrap(self, machine: RemoteMachine, record: RunRecord) -> _Bootstrap | None:
        """The bootstrap to follow instead of starting one, if any.

        That is one still running, or any while the run is bootstrapping (a finished one left its outcome in its
        events).
        """
        marker = shlex.quote(f"{record.remote_dir}/{BOOTSTRAP_MARKER}")
        started = _parse_bootstrap_marker(await machine.run(f"cat {marker} 2>/dev/null || true"))
        if started is None:
            return None
        if record.state is RunState.BOOTSTRAPPING or await self._bootstrap_running(machine, started.pid):
            return started
        return None

    async def _bootstrap_running(self, machine: RemoteMachine, pid: int) -> bool:
        cmdline = await machine.run(f"cat /proc/{int(pid)}/cmdline 2>/dev/null | tr '\\0' ' '; true")
        return "trainer_payload bootstrap" in cmdline  # not another process that got the pid after a reboot

    async def _follow_bootstrap(self, run_id: str, machine: RemoteMachine, started: _Bootstrap) -> str | None:
        """Follows a bootstrap's events until it is ready (None) or failed (why); the UI's words come from them."""
        mirrored = await asyncio.to_thread(mirrored_events, self.folder(run_id))
        end = _bootstrap_end(mirrored, started.after_seq)  # read before the app was closed, not acted on
        while end is None:
            running = await self._bootstrap_running(machine, started.pid)  # asked first: its last words are read next
            end = _bootstrap_end(await self._read_events(run_id, machine) or [], started.after_seq)
            if end is not None:
                break
            if not running:
                return await self._bootstrap_silent_end(run_id, machine)
            await asyncio.sleep(self.options.poll_seconds)
        if end["event"] == EventKind.ERROR:
            return f"preparing the machine failed ({end.get('kind')}): {end.get('message')} — {end.get('hint')}"
        return None

    async def _bootstrap_silent_end(self, run_id: str, machine: RemoteMachine) -> str:
        """Why a bootstrap that ended without a final event failed: the last lines of its log."""
        log = shlex.quote(f"{self.store.get(run_id).remote_dir}/{BOOTSTRAP_LOG}")
        output = await machine.run(f"tail -n 5 {log} 2>/dev/null; true")
        tail = " | ".join(line.strip() for line in output.splitlines() if line.strip())[-800:] or "no output"
        return (
            f"preparing the machine failed: the bootstrap ended without a result ({tail}); "
            "check [target] python and the machine's disk and network"
        )

    async def _launch(self, run_id: str, machine: RemoteMachine) -> None:
        record = self.store.get(run_id)
        if record.state is not RunState.TRAINING:
            record = self.store.transition(run_id, RunState.TRAINING)
        command = _payload_command(
            record,
            f"run {JOB_FILE_NAME} > out/payload.log 2>&1 < /dev/null & echo $!",
            detached=True,
            python=VENV_PYTHON,
        )
        pid = int((await machine.run(command, stdin=await asyncio.to_thread(self._token_stdin, run_id))).strip())
        self.store.update(run_id, pid=pid)
        self.report(f"trainer started (pid {pid})")

    async def _workdir_exists(self, machine: RemoteMachine, record: RunRecord) -> bool:
        out = await machine.run(f"[ -f {shlex.quote(str(record.remote_dir))}/{JOB_FILE_NAME} ] && echo yes || true")
        return out.strip() == "yes"

    # -- monitoring ------------------------------------------------------------------------------------------------

    async def _read_events(self, run_id: str, machine: RemoteMachine) -> list[dict[str, Any]] | None:
        """New events since the stored offset, mirrored locally; None when the events file is gone."""
        record = self.store.get(run_id)
        data = await machine.read_from(f"{record.remote_dir}/out/{EVENTS_FILE_NAME}", record.events_offset)
        if data is None:
            return None
        events, used = parse_event_lines(data)
        fresh = [e for e in events if int(e["seq"]) > record.last_seq]
        if fresh:
            with (self.folder(run_id) / EVENTS_FILE_NAME).open("a", encoding="utf-8") as mirror:
                mirror.writelines(json.dumps(e) + "\n" for e in fresh)
        last = int(fresh[-1]["seq"]) if fresh else record.last_seq
        self.store.update(run_id, events_offset=record.events_offset + used, last_seq=last)
        for event in fresh:
            self.report(describe_event(event))
        return fresh

    async def _monitor(self, run_id: str, machine: RemoteMachine) -> RunRecord:
        while True:
            events = await self._read_events(run_id, machine)
            if events is None and not await self._workdir_exists(machine, self.store.get(run_id)):
                return self._pause(run_id, "machine lost: the remote work folder is gone")
            outcome = await self._handle_all(run_id, machine, _skip_superseded_checkpoints(events or []))
            if outcome is not None:
                return outcome
            if not events and not await self._alive(machine, self.store.get(run_id)):
                relaunched = await self._relaunch(run_id, machine)
                if relaunched is not None:
                    return relaunched
            await self._stop_if_over_budget(run_id, machine)
            await asyncio.sleep(self.options.poll_seconds)

    async def _handle_all(self, run_id: str, machine: RemoteMachine, events: list[dict[str, Any]]) -> RunRecord | None:
        """Acts on events in order; returns the run's record once one of them ends the run."""
        for event in events:
            outcome = await self._handle(run_id, machine, event)
            if outcome is not None:
                return outcome
        return None

    async def _handle(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> RunRecord | None:
        kind = event["event"]
        if kind == "checkpoint":
            await self._pull_checkpoint(run_id, machine, event)
        elif kind == "done":
            return await self._finish(run_id, machine, event)
        elif kind == "error":
            self.store.update(run_id, error=f"{event.get('kind')}: {event.get('message')} — {event.get('hint')}")
        elif kind == "state" and event.get("state") == "failed":
            return await self._on_failed(run_id, machine, event)
        return None

    async def _on_failed(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> RunRecord:
        reason = str(event.get("reason", ""))
        if "SIGTERM" in reason:
            await self._pull_newest_checkpoint(run_id, machine)
            await self._remove_run_key(run_id, machine)
            return self._cancel_stopped(run_id, reason)
        record = self.store.get(run_id)
        return self._fail(run_id, record.error or reason)

    def _cancel_stopped(self, run_id: str, reason: str) -> RunRecord:
        """Ends a run whose trainer stopped on SIGTERM; a budget stop says so and where its checkpoint is."""
        budget = self.store.get(run_id).spec.get("budget_stop")
        if not budget:
            return self.store.transition(run_id, RunState.CANCELLED, reason)
        newest = _newest_local_checkpoint(self.folder(run_id) / "checkpoints")
        where = f"the newest checkpoint is at {newest}" if newest else "no checkpoint had been written"
        why = f"{budget}; training was stopped and {where}"
        self.report(f"cancelled: {why}")
        self.store.update(run_id, error=why)
        return self.store.transition(run_id, RunState.CANCELLED, why)

    def _over_budget(self, run_id: str) -> str | None:
        """Why the run must stop for its budget (the cost so far as the monitor counts it), or None."""
        spec = self.store.get(run_id).spec
        budget, rate = float(spec.get("budget_usd") or 0.0), float(spec.get("hourly_rate_usd") or 0.0)
        if budget <= 0 or rate <= 0 or spec.get("budget_stop"):
            return None
        spent = cost_so_far(rate, self.store.transitions(run_id), time.time())
        return f"budget of ${budget:,.2f} reached (${spent:,.2f} at ${rate:,.2f}/h)" if spent >= budget else None

    async def _stop_if_over_budget(self, run_id: str, machine: RemoteMachine) -> None:
        """Asks the trainer to save and stop once the budget is spent; its failed event then ends the run."""
        why = self._over_budget(run_id)
        if why is None:
            return
        self.report(f"{why}: asking the trainer to save a checkpoint and stop")
        record = self._set_spec(run_id, budget_stop=why)  # remembered, so a reattached app ends it the same way
        if record.pid:
            await machine.run(f"kill -TERM {int(record.pid)} 2>/dev/null || true")

    async def _alive(self, machine: RemoteMachine, record: RunRecord) -> bool:
        status = await machine.run(f"cat /proc/{int(record.pid or 0)}/status 2>/dev/null || true")
        return bool(status) and "\nState:\tZ" not in status

    async def _relaunch(self, run_id: str, machine: RemoteMachine) -> RunRecord | None:
        events = await self._read_events(run_id, machine)  # the last words of the trainer, if any
        outcome = await self._handle_all(run_id, machine, events or [])
        if outcome is not None:
            return outcome
        final = await asyncio.to_thread(_final_event, self.folder(run_id))
        if final is not None:
            # Read before the app was closed, but not acted on (a stop or the adapter download was cut short):
            # finish that instead of training again.
            return await self._handle(run_id, machine, final)
        record = self.store.get(run_id)
        if record.spec.get("budget_stop"):  # stopped for its budget and died before saying so: never train on
            await self._remove_run_key(run_id, machine)
            return self._cancel_stopped(run_id, "")
        if record.relaunches >= self.options.max_relaunches:
            return self._fail(run_id, f"the trainer died {record.relaunches + 1} times; see out/payload.log")
        self.store.update(run_id, relaunches=record.relaunches + 1)
        self.report("the trainer died without a final event; relaunching (it resumes from its checkpoint)")
        await self._launch(run_id, machine)
        return None

    # -- bringing work home -----------------------------------------------------------------------------------

    async def _pull_folder(self, machine: RemoteMachine, remote: str, local: Path, files: dict[str, str]) -> None:
        items = [(f"{remote}/{name}", local / name, digest) for name, digest in files.items()]
        await machine.download_many(items, self._progress("download"))
        # The marker goes last: a folder without it is an unfinished pull and is never resumed from.
        await machine.download(f"{remote}/{CHECKPOINT_MARKER}", local / CHECKPOINT_MARKER)

    async def _pull_checkpoint(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> None:
        async with self._pull_lock:  # "Pull now" and the monitor loop never write the same files at once
            await self._pull_checkpoint_locked(run_id, machine, event)

    async def _pull_checkpoint_locked(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> None:
        record = self.store.get(run_id)
        local_root = self.folder(run_id) / "checkpoints"
        name = Path(event["path"]).name
        if (local_root / name / CHECKPOINT_MARKER).exists():
            return
        try:
            await self._pull_folder(
                machine, f"{record.remote_dir}/out/{event['path']}", local_root / name, event["sha256"]
            )
        except (RemoteError, asyncssh.SFTPNoSuchFile) as exc:
            self.report(f"checkpoint {name} could not be pulled ({exc}); a newer one will be")
            return
        for _step, old in _local_checkpoints(local_root)[: -self.options.keep_local_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        self.report(f"checkpoint {name} is safe on this computer")

    async def _pull_newest_checkpoint(self, run_id: str, machine: RemoteMachine) -> None:
        events = await asyncio.to_thread(mirrored_events, self.folder(run_id))
        newest = next((e for e in reversed(events) if e["event"] == "checkpoint"), None)
        if newest is not None:
            await self._pull_checkpoint(run_id, machine, newest)

    async def _finish(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> RunRecord:
        record = self.store.transition(run_id, RunState.SYNCING)
        await self._pull_newest_checkpoint(run_id, machine)
        record = self.store.transition(run_id, RunState.PULLING)
        local = self.folder(run_id) / "adapter"
        await self._pull_folder(machine, f"{record.remote_dir}/out/{event['adapter_path']}", local, event["files"])
        await machine.run(f"rm -rf {shlex.quote(str(record.remote_dir))}/data", check=False)
        await self._remove_run_key(run_id, machine)
        self.store.update(run_id, adapter=str(local), error=None)
        self.report(f"adapter verified and saved to {local}")
        return self.store.transition(run_id, RunState.FINISHED, f"adapter at {local}")

    async def pull(self, run_id: str, *, driven_here: bool = False) -> Path | None:
        """Pulls the newest checkpoint now; returns the local folder (None when none was written yet).

        Args:
            run_id: The run.
            driven_here: This engine's :meth:`drive` is following the run, so the event stream is already being
                read; only the newest known checkpoint is fetched (if it is not home yet).

        Raises:
            RunBusyError: Another process follows the run (it pulls every checkpoint as it is written).
        """
        lock = None if driven_here else self._driver_lock(run_id)
        try:
            machine = await self._connect(run_id)
            try:
                if not driven_here:  # act on what is read (a done event finishes the run) so nothing is skipped
                    events = await self._read_events(run_id, machine) or []
                    if await self._handle_all(run_id, machine, _skip_superseded_checkpoints(events)) is None:
                        await self._pull_newest_checkpoint(run_id, machine)
                else:
                    await self._pull_newest_checkpoint(run_id, machine)
            finally:
                await _quietly_close(machine)
        finally:
            if lock is not None:
                lock.release()
        return _newest_local_checkpoint(self.folder(run_id) / "checkpoints")

    async def payload_log(self, run_id: str, lines: int = 200) -> str:
        """The last lines of the trainer's own log on the machine (stdout and stderr of the payload)."""
        record = self.store.get(run_id)
        machine = await self._connect(run_id)
        try:
            path = shlex.quote(f"{record.remote_dir}/out/payload.log")
            return await machine.run(f"tail -n {int(lines)} {path} 2>/dev/null || true")
        finally:
            await _quietly_close(machine)

    async def stop(self, run_id: str) -> RunRecord:
        """Asks the trainer to save and stop (SIGTERM), pulls that checkpoint, and cancels the run."""
        record = self.store.get(run_id)
        if record.state in TERMINAL:
            return record
        if record.pid is None:
            return self.store.transition(run_id, RunState.CANCELLED, "stopped before the trainer started")
        try:
            await self.request_stop(run_id)
        except _CONNECTION_ERRORS as exc:
            if record.state is not RunState.PAUSED:
                raise
            why = (
                f"stopped while the machine was unreachable ({type(exc).__name__}); if it still exists, stop it at "
                "your provider. The newest checkpoint on this computer is kept."
            )
            return self.store.transition(run_id, RunState.CANCELLED, why)
        try:
            return await self.drive(run_id)
        except RunBusyError:
            self.report("stop requested; the process following this run pulls the checkpoint and ends it")
            return self.store.get(run_id)

    async def request_stop(self, run_id: str) -> None:
        """Sends SIGTERM to the trainer: it saves a checkpoint and exits; whoever drives the run then ends it."""
        record = self.store.get(run_id)
        if record.pid is None:
            return
        machine = await self._connect(run_id)
        try:
            await machine.run(f"kill -TERM {int(record.pid)} 2>/dev/null || true")
        finally:
            await _quietly_close(machine)

    # -- small helpers -------------------------------------------------------------------------------------------

    def _pause(self, run_id: str, why: str) -> RunRecord:
        self.report(f"paused: {why}")
        self.store.update(run_id, error=why)
        return self.store.transition(run_id, RunState.PAUSED, why)

    def _fail(self, run_id: str, why: str) -> RunRecord:
        self.report(f"failed: {why}")
        self.store.update(run_id, error=why)
        return self.store.transition(run_id, RunState.FAILED, why)

    def _progress(self, verb: str) -> Callable[[str, int, int], None]:
        started, last = time.monotonic(), [0.0]

        def show(name: str, done: int, total: int) -> None:
            now = time.monotonic()
            if total < 5_000_000 or (done < total and now - last[0] < 1):
                return  # small files: the folder-level message says enough
            last[0] = now
            rate = done / max(now - started, 1e-6)
            eta = (total - done) / rate if rate else 0.0
            self.report(
                f"{verb} {name}: {done / 1e6:,.1f} / {total / 1e6:,.1f} MB at {rate / 1e6:,.1f} MB/s, {eta:,.0f} s left"
            )

        return show


def _payload_command(record: RunRecord, arguments: str, *, detached: bool = False, python: str | None = None) -> str:
    """A shell command running the payload in the run's folder with the HF token read from stdin.

    The token arrives on stdin and lives only in the payload's environment: never in argv, never in a file.
    ``python`` defaults to the target's (the bootstrap's); the trainer runs with the venv's, :data:`VENV_PYTHON`.
    """
    python = shlex.quote(python or record.spec["python"])
    prefix = "mkdir -p out; " if detached else ""
    launcher = "setsid nohup " if detached else ""
    return (
        f"cd {shlex.quote(str(record.remote_dir))} || exit 1; {prefix}IFS= read -r HF_TOKEN; "
        '[ -n "$HF_TOKEN" ] && export HF_TOKEN || unset HF_TOKEN; '
        f"PYTHONPATH=payload {launcher}{python} -m trainer_payload {arguments}"
    )


def _parse_bootstrap_marker(text: str) -> _Bootstrap | None:
    """The bootstrap marker's "pid seq" (None when missing or not two numbers: the machine is untrusted)."""
    parts = text.split()
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return _Bootstrap(int(parts[0]), int(parts[1]))


def _bootstrap_end(events: list[dict[str, Any]], after_seq: int) -> dict[str, Any] | None:
    """The event that ended the bootstrap begun after event ``after_seq``: its ``ready`` state or its error."""
    return next(
        (
            e
            for e in events
            if int(e["seq"]) > after_seq
            and (e["event"] == EventKind.ERROR or (e["event"] == EventKind.STATE and e.get("ready") is True))
        ),
        None,
    )


def _local_model_files(base_model: str) -> list[tuple[Path, str]]:
    """A model folder on this computer travels with the run (to ``model/``); a Hub id is downloaded there."""
    folder = Path(base_model).expanduser()
    if not folder.is_dir():
        return []
    return [
        (path, f"model/{path.relative_to(folder).as_posix()}")
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    ]


def _model_from_hub(folder: Path, base_model: str) -> bool:
    """Whether the run's job downloads its model from the Hub (a local model folder is uploaded to ``model/``).

    The job file written at upload decides (the local folder may have moved since); without it, the spec does.
    """
    try:
        job = json.loads((folder / JOB_FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return not Path(base_model).expanduser().is_dir()
    return not isinstance(job, dict) or job.get("base_model") != "model"  # what _upload names a local folder


def _skip_superseded_checkpoints(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drops checkpoint events followed by a newer one in the same batch: only the newest is worth pulling."""
    last = max((i for i, e in enumerate(events) if e["event"] == "checkpoint"), default=-1)
    return [e for i, e in enumerate(events) if e["event"] != "checkpoint" or i == last]


def _payload_files() -> list[Any]:
    package = resources.files("trainer_payload")
    return sorted((p for p in package.iterdir() if p.name.endswith((".py", ".txt"))), key=lambda p: p.name)


def _local_checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(int(p.name.split("-")[1]), p) for p in root.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    return sorted(found)


def _newest_local_checkpoint(root: Path) -> Path | None:
    complete = [p for _s, p in _local_checkpoints(root) if (p / CHECKPOINT_MARKER).exists()]
    return complete[-1] if complete else None


def mirrored_events(folder: Path) -> list[dict[str, Any]]:
    """The run's events as mirrored on this computer."""
    path = folder / EVENTS_FILE_NAME
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _final_event(folder: Path) -> dict[str, Any] | None:
    """The trainer's last word when it ended the job (``done``, or the ``failed`` state), else None."""
    events = mirrored_events(folder)
    last = events[-1] if events else None
    if last is not None and last["event"] == "state" and last.get("state") == "done":
        last = next((e for e in reversed(events) if e["event"] == "done"), None)
    if last is not None and (last["event"] == "done" or (last["event"] == "state" and last.get("state") == "failed")):
        return last
    return None


def describe_event(event: dict[str, Any]) -> str:
    """One event as a line for people."""
    kind = event["event"]
    if kind == "step":
        rate = event.get("tokens_per_s")
        return f"step {event['step']}: loss {event['loss']:.4f}" + (f", {rate:,.0f} tok/s" if rate else "")
    if kind == "state":
        return f"[{event['state']}] " + " ".join(
            f"{k}={v}" for k, v in event.items() if k not in {"ts", "seq", "event", "state"} and v is not None
        )
    if kind == "error":
        return f"error ({event.get('kind')}): {event.get('message')}\n  hint: {event.get('hint')}"
    if kind == "checkpoint":
        return f"checkpoint at step {event['step']} ({event['bytes'] / 1e6:,.1f} MB)"
    if kind == "done":
        return f"done in {event.get('train_seconds')} s of training"
    return json.dumps(event)


async def _quietly_close(machine: RemoteMachine) -> None:
    try:
        await asyncio.wait_for(machine.close(), 5)
    except (*_CONNECTION_ERRORS,):
        return
