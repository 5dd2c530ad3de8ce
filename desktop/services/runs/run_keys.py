"""The run's own SSH key on its machine: installed on first contact, removed when the run ends.

A key that cannot be removed at the end (the machine is gone for now) stays recorded and is removed at the next
contact with that machine, by any run there or by ``rentune doctor``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import filelock

from desktop.core.runs.spec import parse_ssh_url
from desktop.services.machines.failures import MACHINE_ERRORS, classify
from desktop.services.machines.keys import (
    DEFAULT_AUTHORIZED_KEYS,
    create_run_key,
    delete_run_key,
    install_command,
    load_run_key,
    remove_command,
)
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import Endpoint
from desktop.services.platform.logs import get_logger
from desktop.services.runs.context import DRIVER_LOCK_NAME, ENDED, RunContext, quietly_close
from desktop.services.runs.store import InstalledKey, UnknownRunError

_log = get_logger("engine")


async def install_run_key(ctx: RunContext, run_id: str, machine: Machine) -> bool:
    """Adds the run's public key to the machine once; True when it was just installed.

    The key is recorded as installed before the command runs, so an answer lost on the way still gets it
    removed later.
    """
    record = ctx.store.get(run_id)
    target = record.target
    rented = record.spec.get("rental") or record.spec.get("rented_node")
    if not target or rented or ctx.store.installed_keys(target, run_id):
        return False  # (a rented machine got the run's key from its provider, and goes with the run)
    public = record.spec.get("run_key_public")
    if public and await asyncio.to_thread(load_run_key, run_id) is None:
        public = await asyncio.to_thread(create_run_key, run_id)  # removed with an earlier ending: a new pair
        record = ctx.set_spec(run_id, run_key_public=public)
    if not public:
        return False
    authorized = record.spec.get("authorized_keys") or DEFAULT_AUTHORIZED_KEYS
    identity = record.spec.get("identity")
    ctx.store.remember_key(InstalledKey(run_id, target, public, authorized, machine.host_key, identity, time.time()))
    await machine.run(install_command(public, authorized))
    ctx.set_spec(run_id, run_key_installed=True)
    ctx.report("installed this run's own SSH key on the machine (removed when the run ends)")
    return True


async def release_key(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Removes the run's key from the machine; one that cannot be removed now is removed at the next contact."""
    record = ctx.store.get(run_id)
    for key in ctx.store.installed_keys(record.target or "", run_id):
        try:
            await _remove_key(ctx, machine, key)
        except MACHINE_ERRORS as exc:
            ctx.report(
                f"the run's SSH key could not be removed from the machine now ({classify(exc).message}); "
                "it is removed at the next contact (rentune doctor lists it)"
            )
            return
    ctx.set_spec(run_id, run_key_installed=False)


async def _remove_key(ctx: RunContext, machine: Machine, key: InstalledKey) -> None:
    """Takes one recorded key off the machine and forgets it (and its private half once it is nowhere)."""
    await machine.run(remove_command(key.public_key, key.authorized_keys), time_limit=60)
    ctx.store.forget_key(key.run_id, key.target)
    if not ctx.store.installed_keys(run_id=key.run_id):
        await asyncio.to_thread(delete_run_key, key.run_id)


async def remove_stale_keys_here(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Removes keys of ended runs that an earlier ending could not remove from this run's machine."""
    record = ctx.store.get(run_id)
    for key in ctx.store.installed_keys(record.target or ""):
        if key.run_id == run_id or not is_stale_key(ctx, key):
            continue
        try:
            await _remove_key(ctx, machine, key)
        except MACHINE_ERRORS as exc:
            _log.warning("could not remove the key of run %s from %s: %s", key.run_id, key.target, exc)
            return
        ctx.report(f"removed the SSH key of ended run {key.run_id} from the machine")


def is_stale_key(ctx: RunContext, key: InstalledKey) -> bool:
    """Whether a recorded key belongs to a run that has ended (or was deleted) and that nobody follows."""
    try:
        state = ctx.store.get(key.run_id).state
    except UnknownRunError:
        return True
    folder = ctx.store.runs_dir / key.run_id
    if state not in ENDED or not folder.is_dir():
        return state in ENDED
    lock = filelock.FileLock(folder / DRIVER_LOCK_NAME, blocking=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        return False  # a resume of that run is under way: it uses the key
    lock.release()
    return True


async def remove_stale_keys(ctx: RunContext, time_limit: float = 10) -> list[InstalledKey]:
    """Removes the keys of ended runs from their machines where they can be reached; returns the keys left.

    Each machine is logged in to as its run did (host key pinned, the run's key or the user's identity).
    """
    stale = [key for key in ctx.store.installed_keys() if is_stale_key(ctx, key)]
    await asyncio.gather(*(_remove_key_remotely(ctx, key, time_limit) for key in stale))
    return ctx.store.installed_keys()


async def _remove_key_remotely(ctx: RunContext, key: InstalledKey, time_limit: float) -> None:
    user, host, port = parse_ssh_url(key.target)
    run_key = await asyncio.to_thread(load_run_key, key.run_id)
    keys = tuple(k for k in (run_key, Path(key.identity) if key.identity else None) if k is not None)
    try:
        machine = await ctx.connect(Endpoint(host, port, user, keys), key.host_key, time_limit)
    except MACHINE_ERRORS as exc:
        _log.info("cannot reach %s to remove the key of run %s: %s", key.target, key.run_id, exc)
        return
    try:
        await _remove_key(ctx, machine, key)
    except MACHINE_ERRORS as exc:
        _log.info("could not remove the key of run %s from %s: %s", key.run_id, key.target, exc)
    finally:
        await quietly_close(machine)
