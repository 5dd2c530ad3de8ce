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
from desktop.services.machines.failures import MACHINE_ERRORS, Backoff, PermanentError, classify
from desktop.services.machines.keys import (
    DEFAULT_AUTHORIZED_KEYS,
    create_run_key,
    delete_run_key,
    install_command,
    load_run_key,
    remove_command,
)
from desktop.services.machines.ssh import READ_LIMIT, Endpoint, RemoteError, RemoteMachine, fingerprint
from desktop.services.platform.environment import EnvironmentCheck
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretName, SecretStore, SecretStoreError
from desktop.services.runs.events import (
    append_mirror,
    ascending,
    describe_event,
    final_event,
    mirrored_events,
    newest_checkpoint_only,
)
from desktop.services.runs.store import InstalledKey, RunRecord, RunStore, UnknownRunError
from trainer_payload.protocol import (
    CHECKPOINT_MARKER,
    EVENTS_FILE_NAME,
    JOB_FILE_NAME,
    VENV_PYTHON,
    EventKind,
    JobState,
    StopCause,
    UnsafePathError,
    check_relative_path,
    parse_event_chunk,
)

Report = Callable[[str], None]
_log = get_logger("engine")
DRIVER_LOCK_NAME = ".driver.lock"
#: On the machine, relative to the run's folder: the detached bootstrap's "pid seq" (seq: the last event before it
#: began) and its output.
BOOTSTRAP_MARKER = "out/bootstrap.pid"
BOOTSTRAP_LOG = "out/bootstrap.log"
#: Where the trainer's pid lives on the machine (relative to the run's folder): one trainer per folder.
TRAINER_PID_FILE = "out/trainer.pid"
_PID_MARKER = "RENTUNE_PID="
#: States in which a run has ended for now: its key comes off the machine.
ENDED = frozenset({*TERMINAL, RunState.FAILED})


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
    if identity and Path(identity).is_file():
        keys.append(Path(identity))
    elif identity and not keys:
        raise PermanentError(
            f"the key file {identity} does not exist; point [target] identity (or --identity) at your private key, "
            "then resume the run"
        )
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
        self._backoffs: dict[str, Backoff] = {}

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
        if not self.store.installed_keys(run_id=run_id):
            delete_run_key(run_id)  # a key still on a machine keeps its private half until it is removed there

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
        """Sessions on the machine until the run ends or pauses; passing failures are retried with backoff."""
        backoff = self._backoffs[run_id] = Backoff(self.options.poll_seconds, self.options.grace_seconds)
        try:
            while True:
                try:
                    return await self._session(run_id)
                except MACHINE_ERRORS as exc:
                    verdict = classify(exc)
                    if verdict.permanent:
                        return self._fail(run_id, verdict.message)
                    delay = backoff.next_delay()
                    if delay is None:
                        unreachable = f"machine unreachable for {backoff.failing_for():.0f} s ({verdict.message})"
                        return self._pause(run_id, unreachable)
                    self.report(f"cannot reach the machine ({verdict.message}); retrying in {delay:.1f} s")
                    await asyncio.sleep(delay)
        finally:
            self._backoffs.pop(run_id, None)

    def _made_progress(self, run_id: str) -> None:
        """The machine works: a later failure starts a fresh grace period."""
        backoff = self._backoffs.get(run_id)
        if backoff is not None:
            backoff.reset()

    async def _session(self, run_id: str) -> RunRecord:
        """One connection: works the run until it ends or pauses; its key comes off the machine when it ends.

        Raises:
            OSError, asyncssh.Error, RemoteError: The connection failed in a way reconnecting may fix.
        """
        if self.store.get(run_id).state in {RunState.PLANNED, RunState.PAUSED}:
            self.store.transition(run_id, RunState.CONNECTING)  # only driving moves a run; pull and logs look
        machine = await self._connect(run_id, install_key=True)
        try:
            try:
                outcome = await self._on_machine(run_id, machine)
            except MACHINE_ERRORS as exc:
                verdict = classify(exc)
                if not verdict.permanent:
                    raise
                outcome = self._fail(run_id, verdict.message)
            if outcome.state in ENDED:
                await self._release_key(run_id, machine)
            return outcome
        finally:
            await _quietly_close(machine)

    async def _connect(self, run_id: str, time_limit: float = 20, *, install_key: bool | None = None) -> RemoteMachine:
        """Logs in (pinning or checking the host key) and settles in; never changes the run's state.

        Args:
            run_id: The run.
            time_limit: Seconds the login may take.
            install_key: Whether the run's own key is installed first; by default only while the run has not ended.
        """
        record = self.store.get(run_id)
        endpoint = await asyncio.to_thread(_endpoint, record)
        machine = await RemoteMachine.connect(endpoint, record.host_key, time_limit)
        if install_key is None:
            install_key = record.state not in ENDED
        try:
            return await self._settle_in(run_id, record, machine, install_key)
        except BaseException:
            await _quietly_close(machine)  # cancelled or failed half-way: never leave the connection open
            raise

    async def _settle_in(
        self, run_id: str, record: RunRecord, machine: RemoteMachine, install_key: bool = True
    ) -> RemoteMachine:
        """Pins the host key, switches to the run's own key and finds the remote folder on a fresh connection."""
        if record.host_key is None:
            self.store.update(run_id, host_key=machine.host_key, fingerprint=fingerprint(machine.host_key))
            self.report(f"pinned host key of {record.target}: {fingerprint(machine.host_key)}")
        await self._remove_stale_keys(run_id, machine)
        if install_key and await self._install_run_key(run_id, machine):
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

    # -- the run's own SSH key ------------------------------------------------------------------------------------

    async def _install_run_key(self, run_id: str, machine: RemoteMachine) -> bool:
        """Adds the run's public key to the machine once; True when it was just installed.

        The key is recorded as installed before the command runs, so an answer lost on the way still gets it
        removed later.
        """
        record = self.store.get(run_id)
        target = record.target
        if not target or self.store.installed_keys(target, run_id):
            return False
        public = record.spec.get("run_key_public")
        if public and await asyncio.to_thread(load_run_key, run_id) is None:
            public = await asyncio.to_thread(create_run_key, run_id)  # removed with an earlier ending: a new pair
            record = self._set_spec(run_id, run_key_public=public)
        if not public:
            return False
        authorized = record.spec.get("authorized_keys") or DEFAULT_AUTHORIZED_KEYS
        identity = record.spec.get("identity")
        self.store.remember_key(
            InstalledKey(run_id, target, public, authorized, machine.host_key, identity, time.time())
        )
        await machine.run(install_command(public, authorized))
        self._set_spec(run_id, run_key_installed=True)
        self.report("installed this run's own SSH key on the machine (removed when the run ends)")
        return True

    async def _release_key(self, run_id: str, machine: RemoteMachine) -> None:
        """Removes the run's key from the machine; one that cannot be removed now is removed at the next contact."""
        record = self.store.get(run_id)
        for key in self.store.installed_keys(record.target or "", run_id):
            try:
                await self._remove_key(machine, key)
            except MACHINE_ERRORS as exc:
                self.report(
                    f"the run's SSH key could not be removed from the machine now ({classify(exc).message}); "
                    "it is removed at the next contact (rentune doctor lists it)"
                )
                return
        self._set_spec(run_id, run_key_installed=False)

    async def _remove_key(self, machine: RemoteMachine, key: InstalledKey) -> None:
        """Takes one recorded key off the machine and forgets it (and its private half once it is nowhere)."""
        await machine.run(remove_command(key.public_key, key.authorized_keys), time_limit=60)
        self.store.forget_key(key.run_id, key.target)
        if not self.store.installed_keys(run_id=key.run_id):
            await asyncio.to_thread(delete_run_key, key.run_id)

    async def _remove_stale_keys(self, run_id: str, machine: RemoteMachine) -> None:
        """Removes keys of ended runs that an earlier ending could not remove from this machine."""
        record = self.store.get(run_id)
        for key in self.store.installed_keys(record.target or ""):
            if key.run_id == run_id or not self.is_stale_key(key):
                continue
            try:
                await self._remove_key(machine, key)
            except MACHINE_ERRORS as exc:
                _log.warning("could not remove the key of run %s from %s: %s", key.run_id, key.target, exc)
                return
            self.report(f"removed the SSH key of ended run {key.run_id} from the machine")

    def is_stale_key(self, key: InstalledKey) -> bool:
        """Whether a recorded key belongs to a run that has ended (or was deleted) and that nobody follows."""
        try:
            state = self.store.get(key.run_id).state
        except UnknownRunError:
            return True
        folder = self.store.runs_dir / key.run_id
        if state not in ENDED or not folder.is_dir():
            return state in ENDED
        lock = filelock.FileLock(folder / DRIVER_LOCK_NAME, blocking=False)
        try:
            lock.acquire()
        except filelock.Timeout:
            return False  # a resume of that run is under way: it uses the key
        lock.release()
        return True

    async def remove_stale_keys(self, time_limit: float = 10) -> list[InstalledKey]:
        """Removes the keys of ended runs from their machines where they can be reached; returns the keys left.

        Each machine is logged in to as its run did (host key pinned, the run's key or the user's identity).
        """
        stale = [key for key in self.store.installed_keys() if self.is_stale_key(key)]
        await asyncio.gather(*(self._remove_key_remotely(key, time_limit) for key in stale))
        return self.store.installed_keys()

    async def _remove_key_remotely(self, key: InstalledKey, time_limit: float) -> None:
        from desktop.core.runs.spec import parse_ssh_url

        user, host, port = parse_ssh_url(key.target)
        run_key = await asyncio.to_thread(load_run_key, key.run_id)
        keys = tuple(k for k in (run_key, Path(key.identity) if key.identity else None) if k is not None)
        try:
            machine = await RemoteMachine.connect(Endpoint(host, port, user, keys), key.host_key, time_limit)
        except MACHINE_ERRORS as exc:
            _log.info("cannot reach %s to remove the key of run %s: %s", key.target, key.run_id, exc)
            return
        try:
            await self._remove_key(machine, key)
        except MACHINE_ERRORS as exc:
            _log.info("could not remove the key of run %s from %s: %s", key.run_id, key.target, exc)
        finally:
            await _quietly_close(machine)

    async def _on_machine(self, run_id: str, machine: RemoteMachine) -> RunRecord:
        record = self.store.get(run_id)
        if record.pid is None:
            record = await self._adopt_trainer(run_id, machine)
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
        await self._check_workdir(machine, remote, sum(path.stat().st_size for path, _ in files))
        for path, relative in files:
            await machine.upload(path, f"{remote}/{relative}", self._progress("upload"))
            self._made_progress(run_id)
        self.report(f"uploaded {len(files)} files to {record.target}")

    async def _check_workdir(self, machine: RemoteMachine, remote: str, needed: int) -> None:
        """Fails early, in the machine's words, when the work folder cannot be made or written or is too small.

        Raises:
            RemoteError: The folder cannot be made or written (classified as permanent by its message).
            PermanentError: Its disk has too little room for the upload.
        """
        folder, probe = shlex.quote(remote), shlex.quote(f"{remote}/.rentune-write-test")
        out = await machine.run(
            f"mkdir -p {folder} && : > {probe} && rm -f {probe} && df -Pk {folder} | tail -n 1 && du -sk {folder}"
        )
        lines = [line.split() for line in out.splitlines() if line.strip()]
        try:
            free, used = int(lines[0][3]) * 1024, int(lines[1][0]) * 1024
        except (IndexError, ValueError):
            return  # an unusual df: the copy itself will tell
        if free + used < needed:
            raise PermanentError(
                f"the machine has {free / 1e9:,.2f} GB free in {remote} but the upload needs {needed / 1e9:,.2f} GB; "
                "free space (or rent a machine with a larger disk), then resume the run"
            )

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
        """Starts the trainer detached, unless one already runs in the run's folder (then that one is followed).

        Raises:
            PermanentError: The machine would not start it; the message has its output.
        """
        record = self.store.get(run_id)
        if record.state is not RunState.TRAINING:
            record = self.store.transition(run_id, RunState.TRAINING)
        start = f'run {JOB_FILE_NAME} > out/payload.log 2>&1 < /dev/null & pid=$!; echo "$pid" > {TRAINER_PID_FILE}'
        command = (
            f"cd {shlex.quote(str(record.remote_dir))} || exit 1; mkdir -p out || exit 1; {_LIVE_TRAINER} "
            f'if live; then echo "{_PID_MARKER}$pid"; exit 0; fi; {_CLAIM_PID_FILE} '
            + _payload_command(record, f'{start}; echo "{_PID_MARKER}$pid"', detached=True, python=VENV_PYTHON)
        )
        try:
            output = await machine.run(command, stdin=await asyncio.to_thread(self._token_stdin, run_id))
        except RemoteError as exc:
            raise PermanentError(f"the trainer could not be started on the machine: {exc}") from exc
        pid = _marked_pid(output)
        if pid is None:
            raise PermanentError(f"the trainer could not be started on the machine; it answered: {output[-500:]!r}")
        self.store.update(run_id, pid=pid)
        self.report(f"trainer started (pid {pid})")

    async def _adopt_trainer(self, run_id: str, machine: RemoteMachine) -> RunRecord:
        """Follows a trainer already running in the run's folder (its pid was lost) instead of starting another."""
        record = self.store.get(run_id)
        if record.remote_dir is None:
            return record
        command = (
            f"cd {shlex.quote(record.remote_dir)} 2>/dev/null || exit 0; {_LIVE_TRAINER} "
            f'if live; then echo "{_PID_MARKER}$pid"; fi'
        )
        pid = _marked_pid(await machine.run(command))
        if pid is None:
            return record
        if record.state is not RunState.TRAINING:
            self.store.transition(run_id, RunState.TRAINING, f"following the trainer already running (pid {pid})")
        self.report(f"a trainer is already running in the run's folder (pid {pid}); following it")
        return self.store.update(run_id, pid=pid)

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
        try:
            chunk = parse_event_chunk(data)
        except UnsafePathError as exc:
            raise PermanentError(f"the machine sent an unsafe path: {exc}") from None
        used, skipped = chunk.used, chunk.skipped
        if not used and len(data) >= READ_LIMIT:  # one line longer than a whole read: not an event
            used, skipped = len(data), [f"a line of more than {READ_LIMIT:,} bytes"]
        if skipped:
            _log.warning("run %s: skipped event lines from the machine: %s", run_id, "; ".join(skipped))
            self.report(f"skipped {len(skipped)} malformed event line(s) from the machine: {skipped[0]}")
        fresh = ascending(chunk.events, record.last_seq)
        # The mirror dedupes by seq and is fsynced before the offset moves: a crash in between repeats nothing.
        last = await asyncio.to_thread(append_mirror, self.folder(run_id), fresh) if fresh else record.last_seq
        self.store.update(run_id, events_offset=record.events_offset + used, last_seq=max(last, record.last_seq))
        for event in fresh:
            self.report(describe_event(event))
        return fresh

    async def _monitor(self, run_id: str, machine: RemoteMachine) -> RunRecord:
        while True:
            events = await self._read_events(run_id, machine)
            if events is None and not await self._workdir_exists(machine, self.store.get(run_id)):
                return self._pause(run_id, "machine lost: the remote work folder is gone")
            self._made_progress(run_id)
            outcome = await self._handle_all(run_id, machine, newest_checkpoint_only(events or []))
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
        if kind == EventKind.CHECKPOINT:
            await self._pull_checkpoint(run_id, machine, event)
        elif kind == EventKind.DONE:
            return await self._finish(run_id, machine, event)
        elif kind == EventKind.ERROR:
            self.store.update(run_id, error=f"{event.get('kind')}: {event.get('message')} — {event.get('hint')}")
        elif kind == EventKind.STATE and event.get("state") == JobState.FAILED:
            return await self._on_failed(run_id, machine, event)
        return None

    async def _on_failed(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> RunRecord:
        reason = str(event.get("reason", ""))
        if event.get("stopped_by") == StopCause.SIGNAL:
            await self._pull_newest_checkpoint(run_id, machine)
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
        final = await asyncio.to_thread(final_event, self.folder(run_id))
        if final is not None:
            # Read before the app was closed, but not acted on (a stop or the adapter download was cut short):
            # finish that instead of training again.
            return await self._handle(run_id, machine, final)
        record = self.store.get(run_id)
        if record.spec.get("budget_stop"):  # stopped for its budget and died before saying so: never train on
            return self._cancel_stopped(run_id, "")
        if record.relaunches >= self.options.max_relaunches:
            return self._fail(run_id, f"the trainer died {record.relaunches + 1} times; see out/payload.log")
        self.store.update(run_id, relaunches=record.relaunches + 1)
        self.report("the trainer died without a final event; relaunching (it resumes from its checkpoint)")
        await self._launch(run_id, machine)
        return None

    # -- bringing work home -----------------------------------------------------------------------------------

    async def _pull_folder(self, machine: RemoteMachine, remote: str, local: Path, files: dict[str, str]) -> None:
        """Downloads a sealed folder; every file name must stay inside ``local`` (the machine is not trusted)."""
        items = [(f"{remote}/{name}", _inside(local, name), digest) for name, digest in files.items()]
        await machine.download_many(items, self._progress("download"))
        # The marker goes last: a folder without it is an unfinished pull and is never resumed from.
        await machine.download(f"{remote}/{CHECKPOINT_MARKER}", local / CHECKPOINT_MARKER)

    async def _pull_checkpoint(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> None:
        async with self._pull_lock:  # "Pull now" and the monitor loop never write the same files at once
            await self._pull_checkpoint_locked(run_id, machine, event)

    async def _pull_checkpoint_locked(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> None:
        record = self.store.get(run_id)
        local_root = _inside(self.folder(run_id), "checkpoints")
        name = Path(event["path"]).name
        _inside(local_root, name)
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
        newest = next((e for e in reversed(events) if e["event"] == EventKind.CHECKPOINT), None)
        if newest is not None:
            await self._pull_checkpoint(run_id, machine, newest)

    async def _finish(self, run_id: str, machine: RemoteMachine, event: dict[str, Any]) -> RunRecord:
        record = self.store.transition(run_id, RunState.SYNCING)
        await self._pull_newest_checkpoint(run_id, machine)
        record = self.store.transition(run_id, RunState.PULLING)
        local = _inside(self.folder(run_id), "adapter")
        await self._pull_folder(machine, f"{record.remote_dir}/out/{event['adapter_path']}", local, event["files"])
        await machine.run(f"rm -rf {shlex.quote(str(record.remote_dir))}/data", check=False)
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
            RunError: The machine refused (the login, an unsafe file name); the message says what to do.
        """
        lock = None if driven_here else self._driver_lock(run_id)
        try:
            machine = await self._connect_or_explain(run_id)
            try:
                await self._pull_now(run_id, machine, driven_here)
            finally:
                await _quietly_close(machine)
        finally:
            if lock is not None:
                lock.release()
        return _newest_local_checkpoint(self.folder(run_id) / "checkpoints")

    async def _pull_now(self, run_id: str, machine: RemoteMachine, driven_here: bool) -> None:
        try:
            if driven_here:
                await self._pull_newest_checkpoint(run_id, machine)
                return
            # Act on what is read (a done event finishes the run) so nothing is skipped.
            events = await self._read_events(run_id, machine) or []
            outcome = await self._handle_all(run_id, machine, newest_checkpoint_only(events))
            if outcome is None:
                await self._pull_newest_checkpoint(run_id, machine)
        except PermanentError as exc:
            if not driven_here:
                self._fail(run_id, str(exc))
                await self._release_key(run_id, machine)
            raise RunError(str(exc)) from exc
        if outcome is not None and outcome.state in ENDED:
            await self._release_key(run_id, machine)

    async def _connect_or_explain(self, run_id: str) -> RemoteMachine:
        """:meth:`_connect` for a look at the machine: a permanent failure becomes a :class:`RunError`."""
        try:
            return await self._connect(run_id)
        except MACHINE_ERRORS as exc:
            verdict = classify(exc)
            if verdict.permanent:
                raise RunError(verdict.message) from exc
            raise

    async def payload_log(self, run_id: str, lines: int = 200) -> str:
        """The last lines of the trainer's own log on the machine (stdout and stderr of the payload)."""
        record = self.store.get(run_id)
        machine = await self._connect_or_explain(run_id)
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
            record = self.store.transition(run_id, RunState.CANCELLED, "stopped before the trainer started")
            await self._release_key_now(run_id)
            return record
        try:
            await self.request_stop(run_id)
        except MACHINE_ERRORS as exc:
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

    async def _release_key_now(self, run_id: str) -> None:
        """Connects only to take an ended run's key off the machine; a failure leaves it for the next contact."""
        if not self.store.installed_keys(run_id=run_id):
            await asyncio.to_thread(delete_run_key, run_id)
            return
        try:
            machine = await self._connect(run_id, 10, install_key=False)
        except MACHINE_ERRORS as exc:
            why = classify(exc).message
            self.report(f"the run's SSH key stays on the machine for now ({why}); rentune doctor lists it")
            return
        try:
            await self._release_key(run_id, machine)
        finally:
            await _quietly_close(machine)

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


# Shell: `live` is true when out/trainer.pid names a process that is running (not a zombie) in this very folder.
_LIVE_TRAINER = (
    f"pid=$(cat {TRAINER_PID_FILE} 2>/dev/null); case $pid in ''|*[!0-9]*) pid= ;; esac; "
    'live() { [ -n "$pid" ] && [ -d "/proc/$pid" ] && ! grep -q "^State:[[:space:]]*Z" "/proc/$pid/status" '
    '2>/dev/null && [ "$(readlink "/proc/$pid/cwd")" = "$(pwd -P)" ]; };'
)
# Shell: a stale pid file goes, then the file is created anew with noclobber: two launches never both proceed.
_CLAIM_PID_FILE = (
    f"rm -f {TRAINER_PID_FILE}; ( set -C; : > {TRAINER_PID_FILE} ) 2>/dev/null || "
    f"{{ echo 'another launch is starting a trainer in this folder ({TRAINER_PID_FILE} exists)' >&2; exit 1; }};"
)


def _marked_pid(output: str) -> int | None:
    """The pid on the marker line of a command's output; other lines (a chatty login shell) are ignored."""
    for line in output.splitlines():
        value = line.strip().removeprefix(_PID_MARKER)
        if line.strip().startswith(_PID_MARKER) and value.isdigit():
            return int(value)
    return None


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


def _inside(folder: Path, name: str) -> Path:
    """``folder / name`` when it stays inside ``folder`` (links on this computer followed).

    Raises:
        PermanentError: ``name`` is not a plain relative path, or leads out of the folder.
    """
    try:
        check_relative_path(name)
    except UnsafePathError as exc:
        raise PermanentError(f"the machine sent an unsafe path: {exc}") from None
    target = folder / name
    if not target.resolve().is_relative_to(folder.resolve()):
        raise PermanentError(f"the machine sent an unsafe path: {name!r} leads out of {folder} through a link")
    return target


async def run_key_checks() -> list[EnvironmentCheck]:
    """For ``rentune doctor``: removes keys of ended runs where their machines answer, then lists those left.

    Each key still installed is one line: run, machine and since when; keys of live runs are fine, others are
    removed at the next contact with their machine.
    """
    if not (app_paths().data_dir / "runs.db").is_file():
        return []
    engine = RunEngine(options=EngineOptions())
    left = await engine.remove_stale_keys()
    return [_key_check(engine, key) for key in left]


def _key_check(engine: RunEngine, key: InstalledKey) -> EnvironmentCheck:
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(key.since))
    detail = f"run {key.run_id} on {key.target} since {since}"
    if not engine.is_stale_key(key):
        return EnvironmentCheck("Run SSH key", True, detail + " (the run is live)")
    fix = (
        f"removed at the next contact with that machine (any run there, rentune resume, rentune doctor); or delete "
        f"the line ending in rentune-run-{key.run_id} from {key.authorized_keys} there"
    )
    return EnvironmentCheck("Run SSH key", False, detail + " (the run has ended)", fix=fix)


async def _quietly_close(machine: RemoteMachine) -> None:
    try:
        await asyncio.wait_for(machine.close(), 5)
    except MACHINE_ERRORS:
        return
