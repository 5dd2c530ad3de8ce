"""Settling rentals left unfinished before a command runs.

Creates without an answer, terminates not yet confirmed, and machines still running after their run ended:
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
    """Settles the rentals left to settle (``creating``, ``terminating``, live after their run ended), on stderr."""
    from desktop.services.billing.ledger import Ledger, LedgerError
    from desktop.services.renting.ending import to_settle
    from desktop.services.runs.store import RunStore, RunStoreError

    try:
        ledger, store = Ledger(), RunStore()
        if not to_settle(ledger, store):
            return
    except (LedgerError, RunStoreError, OSError):
        return  # the command itself reports an unusable ledger or run database, with its fix
    from desktop.services.platform.secrets import SecretStore
    from desktop.services.renting.reconcile import settle_rentals

    settled = asyncio.run(settle_rentals(store, SecretStore(), ledger=ledger, time_limit=SETTLE_TIME_LIMIT_S))
    for line in settled.lines:
        print(f"rentune: {line}", file=sys.stderr)
