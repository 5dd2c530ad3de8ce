"""``rentune doctor``: what this computer offers (Python, keyring, data folder, tools) and run keys left on machines."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict

from desktop.cli.errors import EXIT_FAILED, EXIT_OK
from desktop.services.billing.ledger import Ledger, LedgerError
from desktop.services.platform.environment import EnvironmentCheck, check_environment
from desktop.services.runs.key_checks import run_key_checks


def rentals_check() -> EnvironmentCheck:
    """Rentals still ``creating`` or ``terminating``: they count as billing until their provider settles them."""
    try:
        unsettled = Ledger().unsettled()
    except (LedgerError, OSError) as exc:
        return EnvironmentCheck("rentals", False, f"the ledger cannot be read ({exc})", "check the data folder")
    if not unsettled:
        return EnvironmentCheck("rentals", True, "none creating or terminating")
    listed = "; ".join(f"{r.provider} {r.instance_id or r.label} of run {r.run_id} {r.state.value}" for r in unsettled)
    return EnvironmentCheck(
        "rentals",
        False,
        f"{len(unsettled)} still settling (counted as billing): {listed}",
        "Rentune settles them at every start; rentune machines does it now (it needs the provider's API key)",
    )


def run_doctor(args: argparse.Namespace) -> int:
    """Prints every check; exit 1 when a required one fails."""
    checks = check_environment() + asyncio.run(run_key_checks())  # run keys still on machines, after a cleanup
    checks.append(rentals_check())
    if args.json:
        print(json.dumps([asdict(check) for check in checks], indent=2))
    else:
        for check in checks:
            mark = "ok " if check.ok else ("ERR" if check.required else "-- ")
            fix = f"  -> {check.fix}" if check.fix else ""
            print(f"[{mark}] {check.name:<18} {check.detail}{fix}")
    return EXIT_OK if all(check.ok for check in checks if check.required) else EXIT_FAILED
