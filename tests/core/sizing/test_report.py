"""The plan as text: durations."""

from __future__ import annotations

import pytest

from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.gpus import GpuSpec
from desktop.core.sizing.plan import Workload, make_plan
from desktop.core.sizing.report import format_hours, plan_text
from desktop.core.sizing.setup import TrainingSetup


@pytest.mark.parametrize(
    ("minutes", "text"),
    [
        (0.0, "0 min"),
        (0.4, "< 1 min"),
        (0.6, "1 min"),
        (59.4, "59 min"),
        (59.6, "1 h 00 min"),
        (125.2, "2 h 05 min"),
        (359.7, "6 h 00 min"),
        (1439.4, "23 h 59 min"),
        (1439.7, "1 d 00 h"),
        (26.6 * 60, "1 d 03 h"),
        (47.6 * 60, "2 d 00 h"),
    ],
)
def test_durations_round_the_total_before_splitting(minutes: float, text: str) -> None:
    assert format_hours(minutes / 60) == text


def test_plan_never_shows_sixty_minutes(catalog: ModelCatalog, gpus: list[GpuSpec]) -> None:
    arch = catalog.find("llama-3.1-8b")
    assert arch is not None
    for tokens in range(1_000_000, 30_000_000, 1_000_000):
        text = plan_text(make_plan(arch, TrainingSetup(), gpus, Workload(tokens=tokens)), "given", str, limit=50)
        assert " 60 min" not in text
