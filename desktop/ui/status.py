"""The status bar's line saying what is running (and so what is being paid for), from the cost meter's reading.

The dollars are :func:`~desktop.services.billing.spend.run_spend`'s, as everywhere: the ledger for rented machines,
the stated rate for the user's own servers.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLabel

from desktop.core.runs.states import RunState
from desktop.services.billing.meter import BillingMachine, MeterReading, read_meter
from desktop.services.billing.records import RunRow
from desktop.ui.context import AppContext
from desktop.ui.cost_words import machine_name, money, rate
from desktop.ui.meter import CostMeter
from desktop.ui.run_words import is_rented, state_badge

IDLE_TEXT = "Ready. No machine is rented."
#: Seconds a one-off message (reattached runs, orphans stopped) stays before the running line takes the place again.
HOLD_S = 8.0


def summary_line(reading: MeterReading) -> str:
    """One line about the live runs: how many, in which state, on which machines, and what they cost so far."""
    live = list(reading.live)
    paused = [record for record in reading.records if record.state is RunState.PAUSED]
    if not live and not paused:
        return IDLE_TEXT
    machines = {machine.run_id: machine for machine in reading.machines if machine.owned}
    parts = [_run_part(record, machines.get(record.id)) for record in live[:2]]
    if len(live) > 2:
        parts.append(f"{len(live) - 2} more live")
    if paused:
        parts.append(f"{len(paused)} paused (open Runs to resume)")
    live_ids = {record.id for record in live}
    spent = sum(cost.spend.usd for cost in reading.overview.runs if cost.run_id in live_ids)
    return "Running: " + "; ".join(parts) + (f" · {money(spent)} so far" if spent > 0 else "")


def _run_part(record: RunRow, machine: BillingMachine | None) -> str:
    """``training on RunPod RTX 4090 at $0.44/h``: the run's state in the monitor's words, and what bills for it."""
    words = state_badge(record)[0].lower()
    if machine is not None:
        return f"{words} on {machine_name(machine)} at {rate(machine.rate_per_hour)}"
    if record.target:
        where = "" if is_rented(record) else "your server "
        return f"{words} on {where}{record.target.removeprefix('ssh://')}"
    return f"{words}, no machine billing yet" if is_rented(record) else f"{words}, no machine yet"


def running_summary(context: AppContext) -> str:
    """:func:`summary_line` of a fresh reading (blocking: a few SQLite reads)."""
    return summary_line(read_meter(context.store))


class RunningStatus(QObject):
    """Rewrites the status bar line whenever the cost meter reads (every few seconds, off the UI thread).

    A one-off message someone else put there stays for :data:`HOLD_S` seconds while runs go on, and until something
    runs while nothing does.
    """

    def __init__(self, meter: CostMeter, label: QLabel, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.label = label
        self._written = label.text()
        self._held, self._held_since = "", 0.0
        meter.sig_updated.connect(self.on_reading)

    def on_reading(self, reading: MeterReading) -> None:
        """Rewrites the line, unless a one-off message is still to be read."""
        text, current = summary_line(reading), self.label.text()
        if current != self._written and self._holding(current):
            return
        if text != IDLE_TEXT or current.startswith("Running: "):
            self.label.setText(text)
            self._written = text

    def _holding(self, message: str) -> bool:
        """Whether a message not written here is still to be read (it stays :data:`HOLD_S` from when first seen)."""
        now = time.monotonic()
        if message != self._held:
            self._held, self._held_since = message, now
        return now - self._held_since < HOLD_S
