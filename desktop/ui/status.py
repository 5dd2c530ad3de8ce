"""The status bar's line saying what is running (and so what is being paid for)."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QLabel

from desktop.core.runs.progress import cost_so_far
from desktop.core.runs.states import LIVE, RunState
from desktop.ui.context import AppContext

IDLE_TEXT = "Ready. No machine is rented."


def running_summary(context: AppContext) -> str:
    """One line about the live runs: how many, in which state, and on which machines."""
    runs = context.store.all()
    live = [record for record in runs if record.state in LIVE]
    paused = [record for record in runs if record.state is RunState.PAUSED]
    if not live and not paused:
        return IDLE_TEXT
    parts = [f"{record.state.value} on {record.target or 'no machine yet'}" for record in live[:2]]
    if len(live) > 2:
        parts.append(f"{len(live) - 2} more live")
    if paused:
        parts.append(f"{len(paused)} paused (open Runs to resume)")
    now = time.time()
    spent = sum(
        cost_so_far(record.spec.get("hourly_rate_usd"), context.store.transitions(record.id), now) for record in live
    )
    money = f" · ${spent:,.2f} so far at your hourly rates" if spent > 0 else ""
    return "Running: " + "; ".join(parts) + money


class RunningStatus(QObject):
    """Refreshes the status bar line every few seconds from the run store (a cheap SQLite read)."""

    def __init__(self, context: AppContext, label: QLabel, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.context, self.label = context, label
        self.timer = QTimer(self)
        self.timer.setInterval(2000)
        self.timer.timeout.connect(self.on_tick)
        self.timer.start()

    def on_tick(self) -> None:
        """Rewrites the line (leaving one-off messages alone while nothing runs)."""
        text = running_summary(self.context)
        if text != IDLE_TEXT or self.label.text().startswith("Running: "):
            self.label.setText(text)
