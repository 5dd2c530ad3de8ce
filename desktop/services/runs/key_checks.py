"""For ``rentune doctor``: the runs' own SSH keys still installed on machines, after removing those it can."""

from __future__ import annotations

import time

from desktop.services.platform.environment import EnvironmentCheck
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.connection import ssh_connect
from desktop.services.runs.context import EngineOptions, RunContext
from desktop.services.runs.run_keys import is_stale_key, remove_stale_keys
from desktop.services.runs.store import InstalledKey, RunStore


async def run_key_checks() -> list[EnvironmentCheck]:
    """Removes keys of ended runs where their machines answer, then lists those left.

    Each key still installed is one line: run, machine and since when; keys of live runs are fine, others are
    removed at the next contact with their machine.
    """
    if not (app_paths().data_dir / "runs.db").is_file():
        return []
    ctx = RunContext(RunStore(), SecretStore(), EngineOptions(), lambda _line: None, ssh_connect)
    left = await remove_stale_keys(ctx)
    return [_key_check(ctx, key) for key in left]


def _key_check(ctx: RunContext, key: InstalledKey) -> EnvironmentCheck:
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(key.since))
    detail = f"run {key.run_id} on {key.target} since {since}"
    if not is_stale_key(ctx, key):
        return EnvironmentCheck("Run SSH key", True, detail + " (the run is live)")
    fix = (
        f"removed at the next contact with that machine (any run there, rentune resume, rentune doctor); or delete "
        f"the line ending in rentune-run-{key.run_id} from {key.authorized_keys} there"
    )
    return EnvironmentCheck("Run SSH key", False, detail + " (the run has ended)", fix=fix)
