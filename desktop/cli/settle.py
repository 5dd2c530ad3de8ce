"""Settling rentals left unfinished (creates without an answer, terminates not yet confirmed) before a command runs.

``rentune run``, ``resume``, ``runs``, ``machines`` and ``costs`` call :func:`settle_at_start` first, so a rental a
killed process left behind is found and ended before anything is listed, summed or rented.
"""

from __future__ import annotations

import asyncio
import sys

#: Commands that settle rentals first.
SETTLING_COMMANDS = frozenset({"run", "resume", "runs", "machines", "costs"})
#: Seconds settling may take before the command goes on (the rest waits for the next start).
SETTLE_TIME_LIMIT_S = 30.0


def settle_at_start() -> None:
    """Settles the ledger's ``creating`` and ``terminating`` rentals, saying what it did on stderr."""
    from desktop.services.billing.ledger import Ledger, LedgerError

    try:
        ledger = Ledger()
        if not ledger.unsettled():
            return
    except (LedgerError, OSError):
        return  # the command itself reports an unusable ledger, with its fix
    from desktop.services.platform.secrets import SecretStore
    from desktop.services.renting.reconcile import settle_rentals
    from desktop.services.runs.store import RunStore

    settled = asyncio.run(settle_rentals(RunStore(), SecretStore(), ledger=ledger, time_limit=SETTLE_TIME_LIMIT_S))
    for line in settled.lines:
        print(f"rentune: {line}", file=sys.stderr)
