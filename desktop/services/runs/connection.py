"""Reaching a run's machine: the login (host key pinned), settling in (the run's own key, its remote folder).

The SSH login is the default :data:`~desktop.services.machines.machine.Connect`; the engine takes any other, so
its logic can be driven without a real machine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncssh

from desktop.core.runs.spec import SshTarget, parse_ssh_url
from desktop.services.machines.failures import MACHINE_ERRORS, PermanentError, classify
from desktop.services.machines.keys import delete_run_key, load_run_key
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import Endpoint, RemoteMachine, fingerprint
from desktop.services.runs.context import ENDED, RunContext, quietly_close
from desktop.services.runs.errors import RunError
from desktop.services.runs.run_keys import install_run_key, release_key, remove_stale_keys_here
from desktop.services.runs.store import RunRecord


async def ssh_connect(endpoint: Endpoint, pinned: str | None, time_limit: float) -> Machine:
    """The default way to a machine: SSH, with the host key pinned (or pinned now, when ``pinned`` is None)."""
    return await RemoteMachine.connect(endpoint, pinned, time_limit)


def pinned_fingerprint(target: SshTarget) -> str | None:
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


def key_owner(record: RunRecord) -> str:
    """Whose run key logs in to the record's machine: a rented cluster's machines all take the run's (the head's)."""
    cluster = record.spec.get("cluster") or {}
    return str(cluster.get("head")) if record.spec.get("rented_node") and cluster.get("head") else record.id


def endpoint(record: RunRecord) -> Endpoint:
    """Where and as whom the run logs in: the run's own key first, the user's identity as the fallback.

    Raises:
        RunError: The run has no target.
        PermanentError: The user's key file is missing and the run has no key of its own.
    """
    if not record.target:
        raise RunError("the run has no target; resume it with --target ssh://user@host:port")
    user, host, port = parse_ssh_url(record.target)
    identity = record.spec.get("identity")
    keys: list[Path | asyncssh.SSHKey] = []
    run_key = load_run_key(key_owner(record)) if record.spec.get("run_key_installed") else None
    if run_key is not None:
        keys.append(run_key)
    if identity and Path(identity).is_file():
        keys.append(Path(identity))
    elif identity and not keys:
        raise PermanentError(
            f"the key file {identity} does not exist; point [target] identity (or --identity) at your private key, "
            "then resume the run"
        )
    return Endpoint(host, port, user, tuple(keys))


async def connect(ctx: RunContext, run_id: str, time_limit: float = 20, *, install_key: bool | None = None) -> Machine:
    """Logs in (pinning or checking the host key) and settles in; never changes the run's state.

    Args:
        ctx: The engine's shared state.
        run_id: The run.
        time_limit: Seconds the login may take.
        install_key: Whether the run's own key is installed first; by default only while the run has not ended.
    """
    record = ctx.store.get(run_id)
    machine = await ctx.connect(await asyncio.to_thread(endpoint, record), record.host_key, time_limit)
    if install_key is None:
        install_key = record.state not in ENDED
    try:
        return await _settle_in(ctx, run_id, record, machine, install_key)
    except BaseException:
        await quietly_close(machine)  # cancelled or failed half-way: never leave the connection open
        raise


async def _settle_in(ctx: RunContext, run_id: str, record: RunRecord, machine: Machine, install_key: bool) -> Machine:
    """Pins the host key, switches to the run's own key and finds the remote folder on a fresh connection."""
    if record.host_key is None:
        ctx.store.update(run_id, host_key=machine.host_key, fingerprint=fingerprint(machine.host_key))
        ctx.report(f"pinned host key of {record.target}: {fingerprint(machine.host_key)}")
    await remove_stale_keys_here(ctx, run_id, machine)
    if install_key and await install_run_key(ctx, run_id, machine):
        await quietly_close(machine)  # from now on the run logs in with its own key
        fresh = await asyncio.to_thread(endpoint, ctx.store.get(run_id))
        machine = await ctx.connect(fresh, machine.host_key, 20)
    if record.remote_dir is None:
        try:
            home = (await machine.run('printf %s "$HOME"')).strip()
        except BaseException:
            await quietly_close(machine)
            raise
        base = record.spec.get("workdir") or f"{home}/.rentune/runs"
        ctx.store.update(run_id, remote_dir=f"{base}/{run_id}")
    return machine


async def connect_or_explain(ctx: RunContext, run_id: str) -> Machine:
    """:func:`connect` for a look at the machine: a permanent failure becomes a :class:`RunError`."""
    try:
        return await connect(ctx, run_id)
    except MACHINE_ERRORS as exc:
        verdict = classify(exc)
        if verdict.permanent:
            raise RunError(verdict.message) from exc
        raise


async def release_key_now(ctx: RunContext, run_id: str) -> None:
    """Connects only to take an ended run's key off the machine; a failure leaves it for the next contact."""
    if not ctx.store.installed_keys(run_id=run_id):
        await asyncio.to_thread(delete_run_key, run_id)
        return
    try:
        machine = await connect(ctx, run_id, 10, install_key=False)
    except MACHINE_ERRORS as exc:
        why = classify(exc).message
        ctx.report(f"the run's SSH key stays on the machine for now ({why}); rentune doctor lists it")
        return
    try:
        await release_key(ctx, run_id, machine)
    finally:
        await quietly_close(machine)
