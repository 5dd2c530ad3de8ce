"""``rentune costs``: what rented machines have cost, from the ledger, and which ones are still billing.

``--json`` prints one object: ``total_usd``, ``month_usd`` and each rental's ``usd`` are rounded to cents;
``price_per_hour`` is the price as recorded; ``started``/``stopped`` are ISO 8601 UTC (``2026-12-01T03:52:10Z``),
``stopped`` null while the machine runs.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.services.billing.ledger import CostSummary, Ledger, LedgerError, Rental
from desktop.services.providers.base import ProviderName

_HEADER = ("RUN", "PROVIDER", "INSTANCE", "GPU", "$/H", "STARTED", "STOPPED", "DOLLARS")


def iso_utc(ts: float) -> str:
    """A unix time as ISO 8601 UTC to the second: ``2026-12-01T03:52:10Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _label(provider: str) -> str:
    try:
        return ProviderName(provider).label
    except ValueError:  # a provider this version does not know: show what was recorded
        return provider


def rental_json(rental: Rental, now: float) -> dict[str, Any]:
    """One rental as the JSON output shows it."""
    return {
        "run_id": rental.run_id,
        "provider": rental.provider,
        "instance_id": rental.instance_id,
        "gpu": rental.gpu,
        "price_per_hour": rental.price_per_hour,
        "started": iso_utc(rental.started),
        "stopped": None if rental.stopped is None else iso_utc(rental.stopped),
        "usd": round(rental.usd(now), 2),
    }


def summary_json(summary: CostSummary) -> dict[str, Any]:
    """The whole summary as the JSON output shows it."""
    return {
        "total_usd": round(summary.total_usd, 2),
        "month_usd": round(summary.month_usd, 2),
        "rentals": [rental_json(rental, summary.now) for rental in summary.rentals],
        "running": [rental_json(rental, summary.now) for rental in summary.running],
    }


def _row(rental: Rental, now: float) -> tuple[str, ...]:
    stopped = "running" if rental.stopped is None else iso_utc(rental.stopped)
    return (
        rental.run_id,
        _label(rental.provider),
        rental.instance_id,
        rental.gpu,
        f"{rental.price_per_hour:.2f}",
        iso_utc(rental.started),
        stopped,
        f"{rental.usd(now):.2f}",
    )


def table_lines(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _still_running(rental: Rental, now: float) -> str:
    return (
        f"still running: {_label(rental.provider)} instance {rental.instance_id} ({rental.gpu}) of run "
        f"{rental.run_id} at ${rental.price_per_hour:.2f}/h, ${rental.usd(now):.2f} so far; "
        f"rentune stop {rental.run_id} ends it"
    )


def summary_text(summary: CostSummary) -> list[str]:
    """The report's lines: the table, the totals, a warning per machine still billing."""
    if not summary.rentals:
        return ["no rentals yet"]
    rows = [_HEADER, *(_row(rental, summary.now) for rental in summary.rentals)]
    totals = f"total ${summary.total_usd:.2f}, this month ${summary.month_usd:.2f}"
    return [*table_lines(rows), "", totals, *(_still_running(rental, summary.now) for rental in summary.running)]


def run_costs(args: argparse.Namespace) -> int:
    """``rentune costs``: prints the rentals and what they cost (``--json`` for one object)."""
    try:
        summary = Ledger().summary()
    except LedgerError as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    except OSError as exc:  # the data folder cannot be created
        raise CliError(
            f"cannot create {exc.filename} ({exc.strerror or exc}); check its permissions, or set RENTUNE_HOME",
            EXIT_FAILED,
        ) from exc
    if args.json:
        print(json.dumps(summary_json(summary), indent=2))
    else:
        print("\n".join(summary_text(summary)))
    return EXIT_OK
