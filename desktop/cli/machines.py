"""``rentune machines``: every machine at every provider, the orphans no live run owns, and stopping them."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.services.billing.ledger import Ledger, LedgerError
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import Instance, ProviderName
from desktop.services.renting.orphans import (
    Machine,
    MachinesReport,
    billing_rate,
    burn_rate,
    list_machines,
    other_computers_rate,
    stop_orphans,
)
from desktop.services.runs.store import RunStore


def machine_dict(machine: Machine) -> dict[str, Any]:
    """One machine as ``--json`` prints it."""
    instance = machine.instance
    return {
        "provider": instance.provider.value,
        "instance_id": instance.instance_id,
        "name": instance.name,
        "state": instance.state.value,
        "price_per_hour": instance.price_per_hour,
        "run_id": machine.run_id,
        "orphan": machine.orphan,
        "other_computer": machine.other_computer,
    }


_HEADER = ["PROVIDER", "ID", "NAME", "STATE", "$/H", "RUN"]


def _row(machine: Machine) -> list[str]:
    instance = machine.instance
    run = machine.run_id or ("ORPHAN" if machine.orphan else "another computer's" if machine.other_computer else "-")
    return [
        instance.provider.label,
        instance.instance_id,
        instance.name,
        instance.state.value,
        f"${instance.price_per_hour:.2f}",
        run,
    ]


def machines_table(machines: list[Machine]) -> str:
    """The machines as an aligned table, a header first."""
    rows = [_HEADER, *(_row(machine) for machine in machines)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines = [
        "  ".join(
            cell.rjust(w) if i == 4 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def orphan_warning(report: MachinesReport) -> str | None:
    """``N orphaned machines burn $X.XX/h: rentune machines --stop-orphans`` (None without orphans)."""
    count = len(report.orphans)
    if not count:
        return None
    noun = "machine burns" if count == 1 else "machines burn"
    return f"{count} orphaned {noun} ${burn_rate(report):.2f}/h: rentune machines --stop-orphans"


def _stopped_line(instance: Instance) -> str:
    return (
        f"stopped {instance.provider.label} {instance.name} ({instance.instance_id}), ${instance.price_per_hour:.2f}/h"
    )


def other_computers_line(report: MachinesReport) -> str | None:
    """What the machines other Rentune installations rented bill (None when there are none)."""
    others = report.other_computers
    if not others:
        return None
    noun = "machine" if len(others) == 1 else "machines"
    return (
        f"{len(others)} {noun} of another computer's Rentune bill ${other_computers_rate(report):.2f}/h (not orphans: "
        "that computer follows them; --stop-orphans --include-other-computers stops them too)"
    )


def unsettled_lines() -> list[str]:
    """One line per rental still being created or terminated (they count as billing)."""
    try:
        rows = Ledger().unsettled()
    except (LedgerError, OSError):
        return []
    return [
        f"still {r.state.value}: {r.provider} {r.instance_id or r.label} of run {r.run_id} (counted as billing; "
        "Rentune retries until the provider settles it)"
        for r in rows
    ]


def _stop(store: RunStore, report: MachinesReport, secrets: SecretStore, others: bool) -> int:
    if not report.orphans and not (others and report.other_computers):
        print("no orphaned machines to stop")
        return EXIT_OK
    stopped, failures = asyncio.run(stop_orphans(store, report, secrets, include_other_computers=others))
    for instance in stopped:
        print(_stopped_line(instance))
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"stopped {len(stopped)} orphaned machines: ${billing_rate(stopped):.2f}/h no longer billed")
    return EXIT_FAILED if failures else EXIT_OK


def run_machines(args: argparse.Namespace) -> int:
    """Lists the machines (a table, or ``--json``) and, with ``--stop-orphans``, terminates the orphans."""
    if args.include_other_computers and not args.stop_orphans:
        raise CliError(
            "--include-other-computers only widens --stop-orphans; to stop other computers' machines too, run "
            "rentune machines --stop-orphans --include-other-computers"
        )
    names, secrets, store = list(ProviderName), SecretStore(), RunStore()
    report = asyncio.run(list_machines(store, secrets, names))
    if len(report.unkeyed) == len(names):
        raise CliError("no API key for any provider; add one with rentune keys set runpod", EXIT_FAILED)
    for note in report.notes:
        print(note, file=sys.stderr)
    if not report.answered:
        raise CliError("no provider answered (see above); check the network and the keys, then try again", EXIT_FAILED)
    if args.stop_orphans:
        return _stop(store, report, secrets, args.include_other_computers)
    if args.json:
        print(json.dumps([machine_dict(m) for m in report.machines], indent=2))
        return EXIT_OK
    asked = ", ".join(name.label for name in report.answered)
    print(machines_table(report.machines) if report.machines else f"no machines at {asked}")
    for line in (orphan_warning(report), other_computers_line(report), *unsettled_lines()):
        if line:
            print(line)
    return EXIT_OK
