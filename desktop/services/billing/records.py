"""What money code reads of a run: the few fields of its record, and the store it comes from.

The run database lives with the engine (:mod:`desktop.services.runs.store`), which sits above billing: the engine
books what it spends. Billing reads runs only through these shapes, which the store's records and the store itself
satisfy, so the money code never imports the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from desktop.core.runs.states import RunState


class RunRow(Protocol):
    """A run as billing reads it (a :class:`~desktop.services.runs.store.RunRecord`)."""

    @property
    def id(self) -> str:
        """The run's id."""
        ...

    @property
    def state(self) -> RunState:
        """Where the run stands."""
        ...

    @property
    def spec(self) -> dict[str, Any]:
        """What the run was asked to do, and what it rents now (``compute``, ``rental``, ``budget_usd``...)."""
        ...

    @property
    def target(self) -> str | None:
        """The machine it trains on, ``ssh://user@host:port`` (None before it has one)."""
        ...

    @property
    def started(self) -> float:
        """When it was created (epoch seconds)."""
        ...

    @property
    def error(self) -> str | None:
        """Why it failed or paused, when it did."""
        ...


class RunRows(Protocol):
    """Where runs are read from (a :class:`~desktop.services.runs.store.RunStore`)."""

    @property
    def runs_dir(self) -> Path:
        """The folder holding one folder per run."""
        ...

    def all(self) -> Sequence[RunRow]:
        """Every run, oldest first."""
        ...

    def get(self, run_id: str) -> RunRow:
        """A run by id or unique prefix."""
        ...

    def transitions(self, run_id: str) -> list[dict[str, Any]]:
        """The run's history: every transition with time and note."""
        ...
