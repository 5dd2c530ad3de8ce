"""What a run rents, read from its record: its ``[compute]`` and the machine it uses now.

Kept apart from the rental driver so that readers (the meter, the spend, the orphan check) load no SSH or engine code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from desktop.core.runs.spec import ComputeSpec
from desktop.services.billing.records import RunRow
from desktop.services.providers.base import ProviderName


@dataclass(frozen=True)
class Rental:
    """The machine a run uses now (kept in the run's spec as ``rental``)."""

    provider: ProviderName
    instance_id: str
    gpu: str
    price_per_hour: float
    spot: bool
    offer_id: str
    created: float
    ready: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {**self.__dict__, "provider": self.provider.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rental:
        """Reads what :meth:`as_dict` wrote."""
        return cls(**{**data, "provider": ProviderName(data["provider"])})


def compute_of(record: RunRow) -> ComputeSpec | None:
    """The run's ``[compute]`` (None for a run on the user's own machine)."""
    data = record.spec.get("compute")
    if not data:
        return None
    return ComputeSpec(**{**data, "providers": tuple(data.get("providers") or ())})


def rental_of(record: RunRow) -> Rental | None:
    """The machine the run rents now (None when it rents none)."""
    data = record.spec.get("rental")
    return Rental.from_dict(data) if data else None
