"""Serving from the machine after training (``[serve] after_training``): a step of the run's life on its machine.

Once the adapter is home (and any export on the machine came home too), the machine is kept: the payload's
``serve`` (:mod:`trainer_payload.serve`) starts vLLM with the adapter as a LoRA module, or llama.cpp's server on the
merged model where vLLM cannot run, on the machine's 127.0.0.1 only. This module starts it (or finds the one it
started before a reconnect), forwards a port of this computer to it over the run's SSH connection, sends one request
through that port before saying it serves, and follows it: the requests answered go into the run's record
(``serving``) for the monitor, and serving ends when the machine says so (idle, or stopped with the run's Stop). The
engine then ends the run, and the machine goes as after any run. The machine bills all along, in plain view: the run
is live, so the tray, Costs and the budget count it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from dataclasses import replace
from typing import Any

import httpx

from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import CommandFailedError
from desktop.services.runs.context import RunContext
from desktop.services.runs.monitor import over_budget
from desktop.services.runs.remote_export import REMOTE_CONVERTERS, upload_llama_cpp
from trainer_payload.protocol import (
    JOB_FILE_NAME,
    SERVE_DIR_NAME,
    SERVE_JOB_FILE_NAME,
    SERVE_STATE_FILE_NAME,
    VENV_PYTHON,
    ServePhase,
    ServeState,
)

#: How long the server may take to load the model before serving is given up (a 70 B model in vLLM takes minutes).
START_MINUTES = 20.0
#: The wrapper's own output (what it says before its server starts, and a traceback if it dies).
WRAPPER_LOG = "out/serve-wrapper.log"
#: The request sent through the forwarded port before the app says the model is served.
SMOKE_REQUEST = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}
SMOKE_TIMEOUT_S = 120.0


class ServeOnMachineError(RuntimeError):
    """Serving from the machine could not start or answer; the message says why (the adapter is home either way)."""


async def serve_on_machine(ctx: RunContext, run_id: str, machine: Machine) -> str:
    """Serves the run's tuned model from its machine until serving ends; returns how it ended, in words.

    Raises:
        RemoteError, OSError, asyncssh.Error: The connection was lost (the engine reconnects; a server already
            running is found again, not started twice).
    """
    remote = str(ctx.store.get(run_id).remote_dir)
    try:
        state = await _started(ctx, run_id, machine, remote)
        if state.phase is not ServePhase.ENDED:
            state = await _until_serving(ctx, run_id, machine, remote, state)
            state = await _serve_forwarded(ctx, run_id, machine, remote, state)
    except (ServeOnMachineError, CommandFailedError) as exc:  # a command the machine refused: its answer says why
        ctx.report(f"serving from the machine failed: {exc}; the adapter is home (Models, Serve runs it here)")
        ctx.set_spec(run_id, serve_error=str(exc), serving=None)
        await _end_wrapper(machine, remote)
        return f"serving failed: {exc}"
    await _end_wrapper(machine, remote)
    asked = _requests(ctx, run_id, state)
    ctx.set_spec(run_id, serving=None, served={"requests": asked, "reason": state.reason})
    return f"served {asked} request{'s' if asked != 1 else ''}; {state.reason or 'serving ended'}"


async def read_state(machine: Machine, remote: str) -> ServeState | None:
    """The machine's serve state, checked field by field; None when there is none (or none readable yet)."""
    raw = await machine.read_from(f"{remote}/out/{SERVE_STATE_FILE_NAME}", 0, 1 << 16)
    if raw is None:
        return None
    try:
        return ServeState.parse(raw.decode("utf-8", "replace"))
    except ValueError as exc:
        raise ServeOnMachineError(f"the machine's serve state is not what Rentune writes ({exc})") from exc


async def _started(ctx: RunContext, run_id: str, machine: Machine, remote: str) -> ServeState:
    """The serving this run started before (a reconnect finds it again), or a new one started now."""
    record = ctx.store.get(run_id)
    if record.spec.get("serve_started"):
        state = await read_state(machine, remote)
        if state is not None and record.spec.get("stop_requested") and state.phase is not ServePhase.ENDED:
            return await _stopped(machine, remote, state)  # the Stop came while nobody followed: it ends now
        if state is not None and (state.phase is ServePhase.ENDED or await _alive(machine, state.pid)):
            return state
        # Started, and gone without a word (the machine restarted, or it was killed): serving ended; never twice.
        return ServeState(ServePhase.ENDED, reason="the server on the machine ended while nobody followed it")
    await _start(ctx, run_id, machine, remote, dict(record.spec["serve"]))
    return ServeState(ServePhase.PREPARING)


async def _start(ctx: RunContext, run_id: str, machine: Machine, remote: str, serve: dict[str, Any]) -> None:
    """Writes the serve job (with llama.cpp's converters where vLLM is not there) and starts the payload's serve."""
    job: dict[str, Any] = {
        "name": serve["name"],
        "idle_minutes": serve["idle_minutes"],
        "context": serve["context"],
        "backend": serve["backend"],
        "start_minutes": START_MINUTES,
    }
    if serve["backend"] == "llama.cpp" or (serve["backend"] == "auto" and not await _has_vllm(machine, remote)):
        ctx.report("no vLLM on the machine: its model is served by llama.cpp's server (merged, as a Q8_0 GGUF)")
        await upload_llama_cpp(ctx, run_id, machine, remote, quantize=False)
        job["converters"] = f"{remote}/{REMOTE_CONVERTERS}"
    quoted = shlex.quote(remote)
    await machine.run(f"cat > {quoted}/out/{SERVE_JOB_FILE_NAME}", stdin=json.dumps(job))
    start = (
        f"cd {quoted} || exit 1; rm -f out/{SERVE_STATE_FILE_NAME}; PYTHONPATH=payload setsid nohup {VENV_PYTHON} "
        f"-m trainer_payload serve {JOB_FILE_NAME} out/{SERVE_JOB_FILE_NAME} > {WRAPPER_LOG} 2>&1 < /dev/null & "
        'echo "$!"'
    )
    said = (await machine.run(start)).strip().splitlines()
    ctx.set_spec(run_id, serve_started=True, serve_error=None)
    ctx.report(f"serving on the machine: starting (pid {said[-1] if said else '?'})")


async def _has_vllm(machine: Machine, remote: str) -> bool:
    """Whether the serving process will choose vLLM here (asked of the payload's own choice: vLLM and a GPU)."""
    probe = "from trainer_payload.serve import choose_backend; print(choose_backend('auto'))"
    command = f"cd {shlex.quote(remote)} && PYTHONPATH=payload {VENV_PYTHON} -c {shlex.quote(probe)}"
    said = await machine.run(command, check=False)
    return said.strip().endswith("vllm")


async def _alive(machine: Machine, pid: int) -> bool:
    if pid <= 0:
        return False
    said = await machine.run(f'[ -d /proc/{int(pid)} ] && ! grep -q "^State:[[:space:]]*Z" /proc/{int(pid)}/status '
                             "&& echo alive; true")  # fmt: skip
    return said.strip() == "alive"


async def _until_serving(ctx: RunContext, run_id: str, machine: Machine, remote: str, state: ServeState) -> ServeState:
    """Follows the start (saying each step) until the server answers on the machine.

    Raises:
        ServeOnMachineError: It ended first, or its process went without a word.
    """
    said = ""
    while state.phase is not ServePhase.SERVING:
        await asyncio.sleep(ctx.options.poll_seconds)
        state = await read_state(machine, remote) or state
        if state.phase is ServePhase.ENDED:
            raise ServeOnMachineError(state.reason or "the server ended before it served")
        if state.detail and state.detail != said:
            said = state.detail
            ctx.report(f"serving on the machine: {said}")
        if state.pid and not await _alive(machine, state.pid):
            tail = await machine.run(f"tail -n 5 {shlex.quote(remote)}/{WRAPPER_LOG} 2>/dev/null; true")
            raise ServeOnMachineError(f"the serving process ended without a word ({' | '.join(tail.split())[-400:]})")
    return state


async def _serve_forwarded(
    ctx: RunContext, run_id: str, machine: Machine, remote: str, state: ServeState
) -> ServeState:
    """Forwards a port here to the server, checks it answers through it, then follows serving until it ends."""
    record = ctx.store.get(run_id)
    asked_port = int(record.spec["serve"].get("local_port") or (record.spec.get("serving") or {}).get("port") or 0)
    try:
        forward = await machine.forward_port(asked_port, state.port)
    except OSError as exc:
        raise ServeOnMachineError(
            f"port {asked_port} on this computer is taken ({exc.strerror or exc}): set [serve] local_port to a free "
            "one, or 0 for any"
        ) from exc
    try:
        url = f"http://127.0.0.1:{forward.get_port()}/v1"
        await _smoke(url, state.model)
        checks = int((record.spec.get("serving") or {}).get("checks", 0)) + 1
        serving = {"url": url, "port": forward.get_port(), "model": state.model, "backend": state.backend}
        ctx.set_spec(run_id, serving=serving | {"checks": checks, "requests": max(0, state.requests - checks)})
        ctx.report(
            f"serving {state.model} at {url} ({state.backend} on the machine; OpenAI-compatible). It stops after "
            f"{state.idle_minutes:g} min without a request, or on Stop; the machine bills until then"
        )
        return await _follow(ctx, run_id, machine, remote, state)
    finally:
        forward.close()


async def _smoke(url: str, model: str) -> None:
    """One chat request through the forwarded port.

    Raises:
        ServeOnMachineError: No answer, or not an OpenAI chat completion.
    """
    try:
        async with httpx.AsyncClient(timeout=SMOKE_TIMEOUT_S) as client:
            answer = await client.post(f"{url}/chat/completions", json={"model": model, **SMOKE_REQUEST})
        answer.raise_for_status()
        choices = answer.json().get("choices")
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise ServeOnMachineError(f"the server did not answer a first request through {url} ({exc})") from exc
    if not choices:
        raise ServeOnMachineError(f"the server's first answer through {url} has no choices")


async def _follow(ctx: RunContext, run_id: str, machine: Machine, remote: str, state: ServeState) -> ServeState:
    """Keeps the run's record up to date with the requests answered until serving ends on the machine."""
    while state.phase is not ServePhase.ENDED:
        await asyncio.sleep(ctx.options.poll_seconds)
        now = await read_state(machine, remote)
        if now is None or (now.phase is not ServePhase.ENDED and not await _alive(machine, now.pid)):
            return ServeState(ServePhase.ENDED, requests=state.requests, reason="the server on the machine went away")
        if (now.requests, now.last_request_at) != (state.requests, state.last_request_at):
            serving = dict(ctx.store.get(run_id).spec.get("serving") or {})
            requests = max(0, now.requests - int(serving.get("checks", 0)))
            ctx.set_spec(run_id, serving=serving | {"requests": requests, "last_request_at": now.last_request_at})
        state = now
        ctx.made_progress(run_id)
        over = over_budget(ctx, run_id)  # an own server's budget (a rented one's is the rental driver's)
        if over is not None:
            ctx.report(f"{over}: serving ends")
            return replace(await _stopped(machine, remote, state), reason=over)
    return state


def _requests(ctx: RunContext, run_id: str, state: ServeState) -> int:
    """Requests the user's programs sent (the app's own first requests not counted)."""
    serving = ctx.store.get(run_id).spec.get("serving") or {}
    return max(0, state.requests - int(serving.get("checks", 0)))


async def _end_wrapper(machine: Machine, remote: str) -> None:
    """Stops a serving process still there and frees the machine's disk of what serving made."""
    state = None
    with contextlib.suppress(ServeOnMachineError):
        state = await read_state(machine, remote)
    if state is not None and state.pid and await _alive(machine, state.pid):
        await machine.run(f"kill -TERM {int(state.pid)} 2>/dev/null; true")
        for _ in range(40):  # it stops its server first: up to 20 s
            if not await _alive(machine, state.pid):
                break
            await asyncio.sleep(0.5)
    quoted = shlex.quote(remote)
    await machine.run(f"rm -rf {quoted}/out/{SERVE_DIR_NAME} {quoted}/tools", check=False)


async def _stopped(machine: Machine, remote: str, state: ServeState) -> ServeState:
    """Stops the serving process and waits for its last word (a killed one's is written here)."""
    await stop_serving(machine, remote)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = await read_state(machine, remote)
        if now is not None and now.phase is ServePhase.ENDED:
            return now
        if now is None or not await _alive(machine, now.pid):
            break
        await asyncio.sleep(0.5)
    return ServeState(ServePhase.ENDED, requests=state.requests, reason="stopped")


async def stop_serving(machine: Machine, remote: str) -> bool:
    """Asks the machine's serving process to end (the run's Stop while it serves); whether one was there."""
    state = await read_state(machine, remote)
    if state is None or state.phase is ServePhase.ENDED or not await _alive(machine, state.pid):
        return False
    await machine.run(f"kill -TERM {int(state.pid)} 2>/dev/null; true")
    return True
