"""The estimator against published peak-memory measurements (tests/data/sizing/vram_measured_public.csv)."""

from __future__ import annotations

import csv
import statistics

from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.memory import estimate_memory
from tests.benchmarks.bench_sizing import leave_one_source_out, score
from tests.fixtures.vram_calibration import CSV_PATH, CalibrationRow, load_calibration


def _errors(rows: list[CalibrationRow]) -> tuple[list[float], list[str]]:
    errors, false_fits = [], []
    for row in rows:
        total = row.comparable_gb(estimate_memory(row.arch, row.setup))
        if row.measured_gb is not None:
            errors.append(total / row.measured_gb - 1)
        elif row.gpu_gb is not None and total <= row.gpu_gb:
            false_fits.append(row.label)
    return errors, false_fits


def test_estimates_meet_the_calibration_targets(catalog: ModelCatalog) -> None:
    rows, _ = load_calibration(catalog)
    errors, false_fits = _errors(rows)
    absolute = sorted(abs(e) for e in errors)
    median = statistics.median(absolute)
    within = sum(e <= 0.25 for e in absolute) / len(absolute)
    summary = f"{len(errors)} measured rows; median |error| {median:.1%}, within ±25 %: {within:.0%}"
    assert len(errors) >= 100, f"most of the published rows must stay expressible ({summary})"
    assert median <= 0.12, summary
    assert within >= 0.90, summary
    assert not false_fits, f"predicted to fit but measured OOM: {false_fits}"


def test_multi_gpu_rows_meet_the_targets(catalog: ModelCatalog) -> None:
    rows, _ = load_calibration(catalog)
    errors, false_fits = _errors([r for r in rows if r.multi_gpu])
    absolute = sorted(abs(e) for e in errors)
    assert len(errors) >= 20
    assert statistics.median(absolute) <= 0.12
    assert sum(e <= 0.25 for e in absolute) / len(absolute) >= 0.90
    assert not false_fits, f"predicted to fit but measured OOM: {false_fits}"


def test_accuracy_holds_out_of_sample(catalog: ModelCatalog) -> None:
    # The README quotes these: each source predicted with the hand-set constants re-chosen on the other sources.
    rows, _ = load_calibration(catalog)
    held_out, _ = leave_one_source_out(rows)
    result = score(rows, lambda r: held_out[r.line])
    assert result["median"] <= 12
    assert result["within25"] >= 90
    assert result["false_fits"] == 0


def test_every_skipped_row_has_a_reason(catalog: ModelCatalog) -> None:
    _, skipped = load_calibration(catalog)
    assert all(row.reason for row in skipped)


def test_every_multi_gpu_row_is_expressed_or_explained(catalog: ModelCatalog) -> None:
    rows, skipped = load_calibration(catalog)
    with CSV_PATH.open(newline="", encoding="utf-8") as handle:
        multi = {line for line, raw in enumerate(csv.DictReader(handle), start=2) if int(raw["n_gpus"] or 1) > 1}
    reasons = {row.line: row.reason for row in skipped}
    expressed = {row.line for row in rows}
    assert multi <= expressed | set(reasons)
    assert all(reasons[line] != "incomplete" for line in multi - expressed)
