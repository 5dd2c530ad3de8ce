"""Starting the trainer: the detached bootstrap (packages, model) followed through its events, then the trainer.

The trainer is launched detached, or adopted when one already runs in the run's folder: one trainer per folder.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass

from desktop.core.runs.states import RunState
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import CommandFailedError
from desktop.services.platform.secrets import SecretName, SecretStoreError
from desktop.services.runs.context import RunContext
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.machine_logs import bring_log_home, with_log
from desktop.services.runs.monitor import read_events
from desktop.services.runs.store import RunRecord
from desktop.services.runs.transfer import model_from_hub
from trainer_payload.protocol import JOB_FILE_NAME, VENV_PYTHON, Event, EventKind

#: On the machine, relative to the run's folder: the detached bootstrap's "pid seq" (seq: the last event before it
#: began) and its output.
BOOTSTRAP_MARKER = "out/bootstrap.pid"
BOOTSTRAP_LOG = "out/bootstrap.log"
#: The trainer's output on the machine (relative to the run's folder).
TRAINER_LOG = "out/payload.log"
#: Where the trainer's pid lives on the machine (relative to the run's folder): one trainer per folder.
TRAINER_PID_FILE = "out/trainer.pid"
_PID_MARKER = "RENTUNE_PID="
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


@dataclass(frozen=True)
class Bootstrap:
    """A bootstrap started on the machine: its process id and the sequence number of the last event before it."""

    pid: int
    after_seq: int


async def bootstrap(ctx: RunContext, run_id: str, machine: Machine, started: Bootstrap | None) -> str | None:
    """Prepares the machine detached and follows it; returns why it failed (the payload's error), None when ready.

    The install and model download can take an hour: detached, they survive a sleeping laptop or a dropped
    connection. A failed install is not a lost connection: retrying it would re-upload and re-install in a loop,
    billing.
    """
    if started is None:
        started = await _start_bootstrap(ctx, run_id, machine)
    elif ctx.store.get(run_id).state is not RunState.BOOTSTRAPPING:
        ctx.store.transition(run_id, RunState.BOOTSTRAPPING)
    return await _follow_bootstrap(ctx, run_id, machine, started)


async def _start_bootstrap(ctx: RunContext, run_id: str, machine: Machine) -> Bootstrap:
    record = ctx.store.get(run_id)
    # The old marker goes before the state says bootstrapping, so a reconnect never follows a finished one.
    await machine.run(f"rm -f {shlex.quote(f'{record.remote_dir}/{BOOTSTRAP_MARKER}')}")
    if record.spec.get("machine_log"):
        ctx.set_spec(run_id, machine_log=None)  # an earlier failure's log: not this attempt's
    record = ctx.store.transition(run_id, RunState.BOOTSTRAPPING)
    launch = (
        f"bootstrap {JOB_FILE_NAME} > {BOOTSTRAP_LOG} 2>&1 < /dev/null & "
        f'echo "$! {record.last_seq}" > {BOOTSTRAP_MARKER}; echo $!'
    )
    command = _payload_command(record, launch, detached=True)
    pid = int((await machine.run(command, stdin=await asyncio.to_thread(_token_stdin, ctx, run_id))).strip())
    ctx.report(f"preparing the machine (pid {pid}): installing the trainer's packages, downloading the model")
    return Bootstrap(pid, record.last_seq)


async def started_bootstrap(machine: Machine, record: RunRecord) -> Bootstrap | None:
    """The bootstrap to follow instead of starting one, if any.

    That is one still running, or any while the run is bootstrapping (a finished one left its outcome in its
    events).
    """
    marker = shlex.quote(f"{record.remote_dir}/{BOOTSTRAP_MARKER}")
    started = _parse_bootstrap_marker(await machine.run(f"cat {marker} 2>/dev/null || true"))
    if started is None:
        return None
    if record.state is RunState.BOOTSTRAPPING or await _bootstrap_running(machine, started.pid):
        return started
    return None


#: Prints a process's command line. It is empty for a moment while the process execs (the bootstrap execs its new
#: environment's Python) and for good once it is a zombie, so an empty one is asked again for up to two seconds.
_COMMAND_LINE = (
    "for _ in 1 2 3 4 5 6 7 8 9 10; do c=$(tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null) || break; "
    '[ -n "$c" ] && {{ echo "$c"; break; }}; sleep 0.2; done; true'
)


async def _bootstrap_running(machine: Machine, pid: int) -> bool:
    cmdline = await machine.run(_COMMAND_LINE.format(pid=int(pid)))
    return "trainer_payload bootstrap" in cmdline  # not another process that got the pid after a reboot


async def _follow_bootstrap(ctx: RunContext, run_id: str, machine: Machine, started: Bootstrap) -> str | None:
    """Follows a bootstrap's events until it is ready (None) or failed (why); the UI's words come from them."""
    mirrored = await asyncio.to_thread(mirrored_events, ctx.folder(run_id))
    end = _bootstrap_end(mirrored, started.after_seq)  # read before the app was closed, not acted on
    while end is None:
        running = await _bootstrap_running(machine, started.pid)  # asked first: its last words are read next
        end = _bootstrap_end(await read_events(ctx, run_id, machine) or [], started.after_seq)
        if end is not None:
            break
        if not running:
            return await _bootstrap_silent_end(ctx, run_id, machine)
        await asyncio.sleep(ctx.options.poll_seconds)
    if end["event"] == EventKind.ERROR:
        log = await bring_log_home(ctx, run_id, machine, BOOTSTRAP_LOG)
        return with_log(
            f"preparing the machine failed ({end.get('kind')}): {end.get('message')} — {end.get('hint')}", log
        )
    return None


async def _bootstrap_silent_end(ctx: RunContext, run_id: str, machine: Machine) -> str:
    """Why a bootstrap that ended without a final event failed: the last lines of its log."""
    log = await bring_log_home(ctx, run_id, machine, BOOTSTRAP_LOG)
    output = await asyncio.to_thread(log.read_text, encoding="utf-8") if log is not None else ""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    tail = " | ".join(lines[-5:])[-800:] or "no output"
    words = (
        f"preparing the machine failed: the bootstrap ended without a result ({tail}); "
        "check [target] python and the machine's disk and network"
    )
    return with_log(words, log)


async def launch(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Starts the trainer detached, unless one already runs in the run's folder (then that one is followed).

    Raises:
        PermanentError: The machine would not start it; the message has its output.
        RemoteError: The connection was lost before the command ended (it passes: the engine reconnects).
    """
    record = ctx.store.get(run_id)
    if record.state is not RunState.TRAINING:
        record = ctx.store.transition(run_id, RunState.TRAINING)
    start = f'run {JOB_FILE_NAME} > {TRAINER_LOG} 2>&1 < /dev/null & pid=$!; echo "$pid" > {TRAINER_PID_FILE}'
    command = (
        f"cd {shlex.quote(str(record.remote_dir))} || exit 1; mkdir -p out || exit 1; {_LIVE_TRAINER} "
        f'if live; then echo "{_PID_MARKER}$pid"; exit 0; fi; {_CLAIM_PID_FILE} '
        + _payload_command(record, f'{start}; echo "{_PID_MARKER}$pid"', detached=True, python=VENV_PYTHON)
    )
    try:
        output = await machine.run(command, stdin=await asyncio.to_thread(_token_stdin, ctx, run_id, trainer=True))
    except CommandFailedError as exc:  # the machine answered: retrying the same command cannot help
        raise PermanentError(f"the trainer could not be started on the machine: {exc}") from exc
    # A connection lost mid-command (no exit status) passes: the next contact follows the trainer if it started
    # (its pid file) or launches again (a half-made pid file is stale and goes).
    pid = _marked_pid(output)
    if pid is None:
        raise PermanentError(f"the trainer could not be started on the machine; it answered: {output[-500:]!r}")
    ctx.store.update(run_id, pid=pid)
    ctx.report(f"trainer started (pid {pid})")


async def adopt_trainer(ctx: RunContext, run_id: str, machine: Machine) -> RunRecord:
    """Follows a trainer already running in the run's folder (its pid was lost) instead of starting another."""
    record = ctx.store.get(run_id)
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
        ctx.store.transition(run_id, RunState.TRAINING, f"following the trainer already running (pid {pid})")
    ctx.report(f"a trainer is already running in the run's folder (pid {pid}); following it")
    return ctx.store.update(run_id, pid=pid)


async def workdir_exists(machine: Machine, record: RunRecord) -> bool:
    """Whether the run's remote folder still holds its job (a machine that lost it cannot go on)."""
    out = await machine.run(f"[ -f {shlex.quote(str(record.remote_dir))}/{JOB_FILE_NAME} ] && echo yes || true")
    return out.strip() == "yes"


def _token_stdin(ctx: RunContext, run_id: str, *, trainer: bool = False) -> str:
    """The two stdin lines the payload's shell reads: the Hub token, then the W&B key.

    The token only when the model comes from the Hub; the W&B key only to the trainer of a run reporting to W&B.
    """
    spec = ctx.store.get(run_id).spec
    hub = model_from_hub(ctx.folder(run_id), spec["base_model"])  # else the model folder travelled with the run
    wandb = trainer and "wandb" in spec["training"].get("report_to", [])
    token = _secret(ctx, SecretName.HUGGINGFACE) if hub else ""
    return f"{token}\n{_secret(ctx, SecretName.WANDB) if wandb else ''}\n"


def _secret(ctx: RunContext, name: SecretName) -> str:
    try:
        return ctx.secrets.get(name) or ""
    except SecretStoreError:
        return ""  # the preflight said so before renting; the trainer says what it misses


def _payload_command(record: RunRecord, arguments: str, *, detached: bool = False, python: str | None = None) -> str:
    """A shell command running the payload in the run's folder with the HF token read from stdin.

    The token and the W&B key arrive on stdin and live only in the payload's environment (the trainer takes the W&B
    key out of it at once): never in argv, never in a file.
    ``python`` defaults to the target's (the bootstrap's); the trainer runs with the venv's, :data:`VENV_PYTHON`.
    """
    python = shlex.quote(python or record.spec["python"])
    prefix = "mkdir -p out; " if detached else ""
    launcher = "setsid nohup " if detached else ""
    return (
        f"cd {shlex.quote(str(record.remote_dir))} || exit 1; {prefix}IFS= read -r HF_TOKEN; "
        '[ -n "$HF_TOKEN" ] && export HF_TOKEN || unset HF_TOKEN; IFS= read -r WANDB_API_KEY; '
        '[ -n "$WANDB_API_KEY" ] && export WANDB_API_KEY || unset WANDB_API_KEY; '
        f"PYTHONPATH=payload {launcher}{python} -m trainer_payload {arguments}"
    )


def _parse_bootstrap_marker(text: str) -> Bootstrap | None:
    """The bootstrap marker's "pid seq" (None when missing or not two numbers: the machine is untrusted)."""
    parts = text.split()
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return Bootstrap(int(parts[0]), int(parts[1]))


def _bootstrap_end(events: list[Event], after_seq: int) -> Event | None:
    """The event that ended the bootstrap begun after event ``after_seq``: its ``ready`` state or its error."""
    return next(
        (
            e
            for e in events
            if e["seq"] > after_seq
            and (e["event"] == EventKind.ERROR or (e["event"] == EventKind.STATE and e.get("ready") is True))
        ),
        None,
    )


def _marked_pid(output: str) -> int | None:
    """The pid on the marker line of a command's output; other lines (a chatty login shell) are ignored."""
    for line in output.splitlines():
        value = line.strip().removeprefix(_PID_MARKER)
        if line.strip().startswith(_PID_MARKER) and value.isdigit():
            return int(value)
    return None
