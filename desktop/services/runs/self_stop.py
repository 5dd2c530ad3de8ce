"""Laptop-closed safety on the desktop side: arming the machine's self-stop, and the heartbeat that holds it off.

When a rented run opts in, the driver writes the self-stop's settings into the run's spec (``self_stop``). The
engine then starts ``trainer_payload.self_stop`` detached beside the trainer (once per machine) and, while it
follows the run, touches ``out/HEARTBEAT`` so the machine knows somebody will pull the adapter and terminate it.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time

from desktop.services.machines.machine import Machine
from desktop.services.platform.secrets import SecretName, SecretStoreError
from desktop.services.runs.context import RunContext
from trainer_payload.protocol import HEARTBEAT_NAME

#: How often the heartbeat is touched while the run is followed (the self-stop waits minutes, not seconds).
HEARTBEAT_SECONDS = 20.0
_PID_FILE = "out/self_stop.pid"


async def ensure_self_stop(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Starts the machine's self-stop unless it runs already (or the run did not opt in)."""
    record = ctx.store.get(run_id)
    settings = record.spec.get("self_stop")
    if not settings or record.remote_dir is None:
        return
    payload = {**settings, "poll_seconds": max(1.0, min(30.0, float(settings["minutes"]) * 15))}
    if settings.get("send_api_key"):
        payload["api_key"] = await asyncio.to_thread(_lambda_key, ctx)
    python = shlex.quote(str(record.spec.get("python") or "python3"))
    command = (
        f"cd {shlex.quote(record.remote_dir)} || exit 1; mkdir -p out; pid=$(cat {_PID_FILE} 2>/dev/null); "
        'case $pid in ""|*[!0-9]*) pid= ;; esac; '
        'if [ -n "$pid" ] && grep -q self_stop "/proc/$pid/cmdline" 2>/dev/null; then exit 0; fi; '
        "IFS= read -r RENTUNE_SELF_STOP; export RENTUNE_SELF_STOP; "
        f"PYTHONPATH=payload setsid nohup {python} -m trainer_payload.self_stop >> out/self_stop.log 2>&1 "
        f"< /dev/null & echo $! > {_PID_FILE}"
    )
    await machine.run(command, stdin=json.dumps(payload) + "\n")  # the settings travel on stdin, never in argv
    minutes = float(settings["minutes"])
    ctx.report(f"self-stop armed: the machine terminates itself {minutes:g} min after training ends unattended")


def _lambda_key(ctx: RunContext) -> str:
    try:
        return ctx.secrets.get(SecretName.LAMBDA) or ""
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
