"""``rentune costs``: what fine-tunes have cost, and what still bills: the same sums as the app's Costs page.

Every stretch of billing is listed: each rented machine (from the ledger) and each run on your own server at the
hourly rate you stated (provider ``own``, no instance or GPU). ``--json`` prints one object: ``total_usd``,
``month_usd``, ``today_usd`` and each line's ``usd`` are unrounded (price per hour times rented hours; round where a
person reads them), ``billing_per_hour`` is what bills now; ``price_per_hour`` is the price as recorded;
``started``/``stopped`` are ISO 8601 UTC (``2026-12-01T03:52:10Z``), ``stopped`` null while it may bill; ``state`` is
``creating``, ``live``, ``terminating`` or ``ended`` (a rental still ``creating`` or ``terminating`` counts as
billing); ``end_estimated`` is true when the stop is the moment Rentune saw the machine gone rather than a time the
provider reported. Today and this month are the computer's local days, as in the app.

``--run RUN`` splits one rented run's bill by what its machines were doing while they billed (every billed second in
one phase, so the phases add up to the run's dollars) and gives its effective training hour: all its dollars over its
hours of training. ``--json`` then prints ``usd``, ``idle_usd``, ``training_hours``, ``usd_per_training_hour`` (null
before any training) and ``phases``: each with ``phase``, ``seconds`` (machine-seconds) and ``usd``, unrounded.

``--rent-or-buy`` weighs renting against owning a card (:mod:`desktop.cli.rent_or_buy`).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from desktop.cli.rent_or_buy import print_rent_or_buy
from desktop.core.runs.bill_phases import BillSplit
from desktop.core.runs.progress import format_duration
from desktop.services.billing.ledger import LedgerError
from desktop.services.billing.spend import OWN_SERVER, Charge, SpendOverview, spend_overview
from desktop.services.providers.base import ProviderName
from desktop.services.runs.bill import run_bill_split
from desktop.services.runs.store import RunStore, UnknownRunError

_HEADER = ("RUN", "PROVIDER", "INSTANCE", "GPU", "$/H", "STARTED", "STOPPED", "DOLLARS")


def iso_utc(ts: float) -> str:
    """A unix time as ISO 8601 UTC to the second: ``2026-12-01T03:52:10Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _label(provider: str) -> str:
    if provider == OWN_SERVER:
        return "Your server"
    try:
        return ProviderName(provider).label
    except ValueError:  # a provider this version does not know: show what was recorded
        return provider


def charge_json(charge: Charge, now: float) -> dict[str, Any]:
    """One stretch of billing as the JSON output shows it."""
    return {
        "run_id": charge.run_id,
        "provider": charge.provider,
        "instance_id": charge.instance_id,
        "gpu": charge.gpu,
        "price_per_hour": charge.rate_per_hour,
        "started": iso_utc(charge.started),
        "stopped": None if charge.stopped is None else iso_utc(charge.stopped),
        "state": charge.state,
        "end_estimated": charge.end_estimated,
        "usd": charge.usd(now),
    }


def overview_json(overview: SpendOverview) -> dict[str, Any]:
    """The whole overview as the JSON output shows it."""
    now = overview.now
    return {
        "total_usd": overview.total_usd,
        "month_usd": overview.month_usd,
        "today_usd": overview.today_usd,
        "billing_per_hour": overview.burn_per_hour,
        "rentals": [charge_json(charge, now) for charge in overview.charges],
        "running": [charge_json(charge, now) for charge in overview.billing],
    }


def _row(charge: Charge, now: float) -> tuple[str, ...]:
    stopped = _stopped_words(charge)
    return (
        charge.run_id,
        _label(charge.provider),
        charge.instance_id or "-",
        charge.gpu or "-",
        f"{charge.rate_per_hour:.2f}",
        iso_utc(charge.started),
        stopped,
        f"{charge.usd(now):.2f}",
    )


def _stopped_words(charge: Charge) -> str:
    if charge.stopped is None:
        return charge.state if charge.state in ("creating", "terminating") else "running"
    return iso_utc(charge.stopped) + (" (est.)" if charge.end_estimated else "")


def table_lines(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _still_running(charge: Charge, now: float) -> str:
    if charge.provider == OWN_SERVER:
        where = "your server"
    else:
        machine = f" {charge.instance_id}" if charge.instance_id else ""
        where = f"{_label(charge.provider)} instance{machine} ({charge.gpu})"
    rate = f"at ${charge.rate_per_hour:.2f}/h, ${charge.usd(now):.2f} so far"
    if charge.state == "creating":
        return (
            f"being created: {where} of run {charge.run_id} {rate}; Rentune looks it up by name at every start "
            "and terminates it if it exists"
        )
    if charge.state == "terminating":
        return (
            f"being terminated: {where} of run {charge.run_id} {rate}; Rentune retries until the provider says it "
            "is gone (rentune machines retries now)"
        )
    return f"still running: {where} of run {charge.run_id} {rate}; rentune stop {charge.run_id} ends it"


def overview_text(overview: SpendOverview) -> list[str]:
    """The report's lines: the table, the totals, a warning per machine still billing."""
    if overview.empty:
        return ["no rentals yet"]
    now = overview.now
    rows = [_HEADER, *(_row(charge, now) for charge in overview.charges)]
    totals = (
        f"total ${overview.total_usd:.2f}, this month ${overview.month_usd:.2f}, today ${overview.today_usd:.2f}"
        + (f", billing ${overview.burn_per_hour:.2f}/h now" if overview.billing else "")
    )
    return [*table_lines(rows), "", totals, *(_still_running(charge, now) for charge in overview.billing)]


def bill_text(run_id: str, split: BillSplit) -> list[str]:
    """A run's bill by phase: a table of the phases it billed in, the paid idle time and the effective hour."""
    rows: list[tuple[str, ...]] = [("PHASE", "MACHINE TIME", "DOLLARS", "SHARE")]
    rows += [
        (cost.phase.value, format_duration(cost.seconds), f"${cost.usd:.2f}", _share(cost.usd, split.usd))
        for cost in split.phases
        if cost.seconds > 0
    ]
    hour = split.effective_usd_per_training_hour
    lines = [f"run {run_id}: ${split.usd:.2f} in all, ${split.idle_usd:.2f} of it while no machine trained", ""]
    lines += [*table_lines(rows), ""]
    if hour is None:
        return [*lines, "no training yet: the effective training hour is known once the run has trained"]
    trained = format_duration(split.training_hours * 3600)
    return [*lines, f"effective training hour: ${hour:.2f} (${split.usd:.2f} for {trained} of training)"]


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole > 0 else ""


def _print_run_bill(run_id: str, as_json: bool) -> int:
    try:
        split = run_bill_split(RunStore(), run_id)
    except UnknownRunError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    if split is None:
        raise CliError(
            f"run {run_id} rented no machine, so no provider billed it (a run on your own server is costed at the "
            "rate you stated: rentune costs lists it)",
            EXIT_USAGE,
        )
    print(json.dumps(split.as_dict(), indent=2) if as_json else "\n".join(bill_text(run_id, split)))
    return EXIT_OK


def run_costs(args: argparse.Namespace) -> int:
    """``rentune costs``: prints what was billed and what still bills (``--json`` for one object).

    With ``--run``, one run's bill by phase instead; with ``--rent-or-buy``, renting against owning a card.
    """
    try:
        if args.run is not None:
            return _print_run_bill(args.run, args.json)
        if args.rent_or_buy:
            return print_rent_or_buy(args)
        overview = spend_overview(RunStore())
    except LedgerError as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    except OSError as exc:  # the data folder cannot be created
        raise CliError(
            f"cannot create {exc.filename} ({exc.strerror or exc}); check its permissions, or set RENTUNE_HOME",
            EXIT_FAILED,
        ) from exc
    if args.json:
        print(json.dumps(overview_json(overview), indent=2))
    else:
        print("\n".join(overview_text(overview)))
    return EXIT_OK
