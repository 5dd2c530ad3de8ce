"""The plan checked against the machine's first minutes: a new time and dollar estimate from the calibration event.

The calibration measures the real job's seconds per optimizer step on the rented GPU. Spent time plus the steps
left at that pace is the new whole; it is an overrun when it passes the budget, or the estimate shown at launch by
more than :data:`OVERRUN_TOLERANCE`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: How far past the estimate shown at launch the measured one may go before the user is asked (25 %).
OVERRUN_TOLERANCE = 0.25
#: The longest a run waits, paused on its billing machine, for the user's answer.
ASK_LIMIT_SECONDS = 600.0


@dataclass(frozen=True)
class Reestimate:
    """The run's estimate after its first measured steps.

    Attributes:
        hours: Billed hours in all: spent so far plus the steps left at the measured pace.
        usd: Dollars in all at the machine's rate (None when nothing prices the run).
        shown_hours: The estimate shown at launch, in hours (None without one).
        shown_usd: Its dollars (None without them).
        budget_usd: The run's budget (0: none).
    """

    hours: float
    usd: float | None
    shown_hours: float | None
    shown_usd: float | None
    budget_usd: float

    @property
    def over_budget(self) -> bool:
        """Whether the measured total passes the budget."""
        return self.budget_usd > 0 and self.usd is not None and self.usd > self.budget_usd

    @property
    def over_estimate(self) -> bool:
        """Whether the measured total passes the launch estimate by more than the tolerance (dollars, else hours)."""
        if self.shown_usd and self.usd is not None:
            return self.usd > self.shown_usd * (1 + OVERRUN_TOLERANCE)
        return bool(self.shown_hours) and self.hours > (self.shown_hours or 0.0) * (1 + OVERRUN_TOLERANCE)

    @property
    def overrun(self) -> bool:
        """Whether the user must decide: over the budget, or well over the estimate."""
        return self.over_budget or self.over_estimate

    def words(self) -> str:
        """``about 3 h 10 min and $5.20 in all, 60 % over the estimate of $3.25`` (and the budget when passed)."""
        money = f" and ${self.usd:,.2f}" if self.usd is not None else ""
        said = f"about {_hours(self.hours)}{money} in all"
        if self.shown_usd and self.usd is not None:
            said += f", {100 * (self.usd / self.shown_usd - 1):+.0f} % against the estimate of ${self.shown_usd:,.2f}"
        elif self.shown_hours:
            said += (
                f", {100 * (self.hours / self.shown_hours - 1):+.0f} % against the {_hours(self.shown_hours)} estimated"
            )
        if self.over_budget:
            said += f"; over the budget of ${self.budget_usd:,.2f}"
        return said


def reestimate(
    calibration: Mapping[str, Any],
    *,
    total_steps: int,
    spent: tuple[float, float | None],
    rate_per_hour: float | None,
    shown: tuple[float | None, float | None],
    budget_usd: float,
) -> Reestimate:
    """The run's new estimate from its ``calibration`` event.

    Args:
        calibration: The event: ``step`` (where it was measured) and ``seconds_per_step``.
        total_steps: The optimizer steps of the whole run (the trainer's own count).
        spent: Billed hours and dollars so far (dollars None when nothing prices the run).
        rate_per_hour: The machine's price per hour now (None or 0: not priced).
        shown: The estimate shown at launch: (hours, dollars), either None when unknown.
        budget_usd: The run's budget (0: none).
    """
    left_hours = max(0, total_steps - int(calibration["step"])) * float(calibration["seconds_per_step"]) / 3600
    spent_hours, spent_usd = spent
    usd = round((spent_usd or 0.0) + left_hours * rate_per_hour, 2) if rate_per_hour else spent_usd
    return Reestimate(spent_hours + left_hours, usd, shown[0], shown[1], budget_usd)


def _hours(hours: float) -> str:
    minutes = round(hours * 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
