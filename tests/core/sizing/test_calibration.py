"""The estimator against published peak-memory measurements (tests/data/sizing/vram_measured_public.csv)."""

from __future__ import annotations

import statistics

from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.memory import estimate_memory
from tests.fixtures.vram_calibration import load_calibration


def test_estimates_meet_the_calibration_targets(catalog: ModelCatalog) -> None:
    rows, skipped = load_calibration(catalog)
    errors = []
    false_fits = []
    for row in rows:
        total = estimate_memory(row.arch, row.setup).per_gpu_total
        if row.oom:
            if row.gpu_gb is not None and total <= row.gpu_gb:
                false_fits.append(row.label)
        else:
            assert row.measured_gb is not None
            errors.append(total / row.measured_gb - 1)
    absolute = sorted(abs(e) for e in errors)
    median = statistics.median(absolute)
    within = sum(e <= 0.25 for e in absolute) / len(absolute)
    summary = (
        f"{len(errors)} measured rows, {len(rows) - len(errors)} OOM rows, {len(skipped)} skipped; "
        f"median |error| {median:.1%}, within ±25 %: {within:.0%}, p90 {absolute[int(0.9 * len(absolute))]:.1%}"
    )
    assert len(errors) >= 100, f"most of the published rows must stay expressible ({summary})"
    assert median <= 0.12, summary
    assert within >= 0.90, summary
    assert not false_fits, f"predicted to fit but measured OOM: {false_fits}"


def test_every_skipped_row_has_a_reason(catalog: ModelCatalog) -> None:
    _, skipped = load_calibration(catalog)
    assert all(row.reason for row in skipped)
