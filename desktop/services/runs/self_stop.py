"""Laptop-closed safety on the desktop side: arming the machine's self-stop, and the heartbeat that holds it off.

When a rented run opts in, the driver writes the self-stop's settings into the run's spec (``self_stop``). The
engine then starts ``trainer_payload.self_stop`` detached beside the trainer (once per machine) and, while it
follows the run, touches ``out/HEARTBEAT`` so the machine knows somebody will pull the adapter and terminate it.

The settings (with the user's API key where the machine needs it and the user allowed sending it: Lambda's, or
RunPod's for the head of a cluster) travel on the command's stdin straight into the self-stop's memory: never in a
command line, an environment variable or a file on the machine.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time

from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import CommandFailedError
from desktop.services.platform.secrets import SecretName, SecretStoreError
from desktop.services.runs.context import RunContext
from trainer_payload.protocol import HEARTBEAT_NAME

#: How often the heartbeat is touched while the run is followed (the self-stop waits minutes, not seconds).
HEARTBEAT_SECONDS = 20.0
#: Where the self-stop keeps its pid, relative to the run's remote folder.
PID_FILE = "out/self_stop.pid"


async def ensure_self_stop(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Starts the machine's self-stop unless it runs already (or the run did not opt in).

    A machine that will not start it is reported, not fatal: training goes on, followed by this app.
    """
    record = ctx.store.get(run_id)
    settings = record.spec.get("self_stop")
    if not settings or record.remote_dir is None:
        return
    payload = {**settings, "poll_seconds": max(1.0, min(30.0, float(settings["minutes"]) * 15))}
    if settings.get("send_api_key"):
        payload["api_key"] = await asyncio.to_thread(_api_key, ctx, str(settings["provider"]))
    try:
        await machine.run(
            arm_command(record.remote_dir, str(record.spec.get("python") or "python3")),
            stdin=json.dumps(payload) + "\n",
        )
    except CommandFailedError as exc:
        ctx.report(
            f"the self-stop could not be started ({exc.said}; exit status {exc.exit_status}): the machine will not "
            "stop itself while this app is closed; see out/self_stop.log in the run's folder on the machine"
        )
        return
    minutes = float(settings["minutes"])
    ctx.report(f"self-stop armed: the machine terminates itself {minutes:g} min after training ends unattended")


def arm_command(remote_dir: str, python: str) -> str:
    """The shell command that starts the self-stop in ``remote_dir`` unless one runs there already.

    The self-stop reads its settings from the command's stdin, then detaches and writes its pid to
    :data:`PID_FILE`, so the command ends at once.
    """
    return (
        f"cd {shlex.quote(remote_dir)} || exit 1; mkdir -p out || exit 1; pid=$(cat {PID_FILE} 2>/dev/null); "
        'case $pid in ""|*[!0-9]*) pid= ;; esac; '
        'if [ -n "$pid" ] && grep -q self_stop "/proc/$pid/cmdline" 2>/dev/null; then exit 0; fi; '
        f"PYTHONPATH=payload exec {shlex.quote(python)} -m trainer_payload.self_stop --detach {PID_FILE} "
        ">> out/self_stop.log 2>&1"
    )


def _api_key(ctx: RunContext, provider: str) -> str:
    """The user's key for ``provider`` from the keyring (or its environment variable), "" when none is known."""
    name = {"lambda": SecretName.LAMBDA, "runpod": SecretName.RUNPOD}.get(provider)
    try:
        return (ctx.secrets.get(name) if name else None) or ""
    except SecretStoreError:
        return ""


async def heartbeat(ctx: RunContext, run_id: str, machine: Machine, last: dict[str, float]) -> None:
    """Touches ``out/HEARTBEAT`` at most every :data:`HEARTBEAT_SECONDS` (only for runs with a self-stop).

    Args:
        ctx: The engine's shared state.
        run_id: The run.
        machine: Its machine.
        last: When each run's heartbeat was last touched (monotonic seconds), kept by the caller.
    """
    record = ctx.store.get(run_id)
    settings = record.spec.get("self_stop")
    if not settings or record.remote_dir is None:
        return
    now = time.monotonic()
    if now - last.get(run_id, 0.0) < min(HEARTBEAT_SECONDS, float(settings["minutes"]) * 20):
        return
    last[run_id] = now
    await machine.run(f"touch {shlex.quote(record.remote_dir)}/out/{HEARTBEAT_NAME}", check=False)
