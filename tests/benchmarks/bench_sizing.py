"""Sizing: Rentune's estimator against the rules of thumb other tools use, on published measurements; plan latency.

Error tables over the expressible rows of tests/data/sizing/vram_measured_public.csv, side by side:
- Rentune: the itemised memory model (``per_gpu_total``, less what a source's counters cannot see);
- LLaMA-Factory README rules (x = billions of parameters): QLoRA x/2, LoRA 2x, full (AMP) 18x GB;
- accelerate ``estimate-memory``: weights + gradients + Adam = 4x the model's size in its load dtype
  (4-bit for QLoRA), batch 1, no activations.
Multi-GPU sharded rows divide the rules' totals by the GPU count (in their favour).

Out of sample: no code fits the estimator to these rows. Everything in it is a byte count of a tensor except two
constants (CUDA context, allocator share), chosen by hand with every row in view. Leave-one-source-out re-chooses
both on the other sources (grid search: fewest OOM rows called fits, then least median |error|) and predicts the
held-out source with them; the rules of thumb fit nothing, so their errors are out of sample as they stand.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable

from desktop.core.sizing.memory import DEFAULT_OVERHEADS, Overheads, estimate_memory
from desktop.core.sizing.setup import Method, Strategy
from desktop.services.models.configs import load_catalog
from tests.benchmarks.common import PYTHON, Row, median_interleaved, print_table
from tests.fixtures.vram_calibration import CalibrationRow, load_calibration

Estimator = Callable[[CalibrationRow], float]
GRID = [
    Overheads(cuda_context_gb=context / 10, allocator_fraction=share / 100)
    for context, share in itertools.product(range(11), range(0, 21, 2))
]


def _shards(row: CalibrationRow) -> int:
    return row.setup.num_gpus if row.setup.strategy is Strategy.FSDP else 1


def rentune(row: CalibrationRow, overheads: Overheads = DEFAULT_OVERHEADS) -> float:
    return row.comparable_gb(estimate_memory(row.arch, row.setup, overheads))


def llama_factory(row: CalibrationRow) -> float:
    x = row.arch.total_params / 1e9
    factor = {Method.QLORA: 0.5, Method.LORA: 2.0, Method.FULL: 18.0, Method.FULL_8BIT: 18.0}[row.setup.method]
    return x * factor / _shards(row)


def accelerate(row: CalibrationRow) -> float:
    bytes_per_param = 0.5 if row.setup.method is Method.QLORA else 2.0
    return 4 * row.arch.total_params * bytes_per_param / 1e9 / _shards(row)


def score(rows: Iterable[CalibrationRow], estimator: Estimator) -> dict[str, float]:
    """Median and p90 of |error|, share within ±25 %, median signed error, and OOM rows called fits."""
    rows = list(rows)
    errors = [estimator(r) / r.measured_gb - 1 for r in rows if r.measured_gb is not None]
    absolute = sorted(abs(e) for e in errors)
    false_fits = sum(1 for r in rows if r.oom and r.gpu_gb is not None and estimator(r) <= r.gpu_gb)
    return {
        "median": statistics.median(absolute) * 100,
        "p90": absolute[int(0.9 * len(absolute))] * 100,
        "within25": sum(e <= 0.25 for e in absolute) / len(absolute) * 100,
        "bias": statistics.median(errors) * 100,
        "false_fits": false_fits,
        "n": len(errors),
    }


def _fit(rows: list[CalibrationRow], predictions: dict[Overheads, dict[int, float]]) -> Overheads:
    """The grid point that calls the fewest OOM rows fits, then has the least median |error|, on ``rows``."""

    def loss(overheads: Overheads) -> tuple[float, float]:
        result = score(rows, lambda r: predictions[overheads][r.line])
        return result["false_fits"], result["median"]

    return min(GRID, key=loss)


def leave_one_source_out(rows: list[CalibrationRow]) -> tuple[dict[int, float], dict[str, Overheads]]:
    """Predicts each source's rows with the constants chosen on every other source.

    Returns:
        The out-of-sample prediction per CSV line, and the constants chosen without each source.
    """
    predictions = {o: {r.line: rentune(r, o) for r in rows} for o in GRID}
    held_out: dict[int, float] = {}
    chosen: dict[str, Overheads] = {}
    for source in sorted({r.source for r in rows}):
        chosen[source] = _fit([r for r in rows if r.source != source], predictions)
        held_out |= {r.line: predictions[chosen[source]][r.line] for r in rows if r.source == source}
    return held_out, chosen


def _print_scores(title: str, results: dict[str, dict[str, float]]) -> None:
    print(title)
    print(f"  {'estimator':<26}{'median |err|':>13}{'p90 |err|':>11}{'within ±25%':>13}{'bias':>9}{'OOM fits':>10}")
    for name, r in results.items():
        print(
            f"  {name:<26}{r['median']:>12.1f}%{r['p90']:>10.1f}%{r['within25']:>12.0f}%{r['bias']:>+8.1f}%"
            f"{r['false_fits']:>10.0f}"
        )


def _print_sources(rows: list[CalibrationRow], held_out: dict[int, float], chosen: dict[str, Overheads]) -> None:
    print("Per held-out source (Rentune median |error|: shipped constants / chosen without it):")
    for source, overheads in chosen.items():
        own = [r for r in rows if r.source == source]
        measured = [r for r in own if not r.oom]
        if not measured:
            continue
        shipped, out = score(own, rentune), score(own, lambda r: held_out[r.line])
        ooms = f"+{len(own) - len(measured)} OOM" if len(own) > len(measured) else ""
        print(
            f"  {source[:62]:<62}{len(measured):>4} rows {ooms:<7}{shipped['median']:>6.1f}% /{out['median']:>6.1f}%"
            f"  (context {overheads.cuda_context_gb:.1f} GB, allocator {overheads.allocator_fraction:.0%})"
        )


def _splits(rows: list[CalibrationRow], estimators: dict[str, Estimator]) -> dict[str, dict[str, float]]:
    """Scores every estimator on all rows, the single-GPU rows and the multi-GPU rows."""
    single, multi = [r for r in rows if not r.multi_gpu], [r for r in rows if r.multi_gpu]
    splits = {"all": rows, "single GPU": single, "multi-GPU": multi}
    return {
        f"{name}, {split}": score(subset, fn) for name, fn in estimators.items() for split, subset in splits.items()
    }


def run() -> bool:
    rows, skipped = load_calibration(load_catalog())
    held_out, chosen = leave_one_source_out(rows)
    estimators: dict[str, Estimator] = {
        "rentune out of sample": lambda r: held_out[r.line],
        "rentune as shipped": rentune,
        "llama-factory": llama_factory,
        "accelerate": accelerate,
    }
    results = _splits(rows, estimators)
    measured, measured_multi = results["rentune as shipped, all"]["n"], results["rentune as shipped, multi-GPU"]["n"]
    print(
        f"{measured:.0f} measured rows ({measured_multi:.0f} multi-GPU) + {sum(r.oom for r in rows)} OOM rows from"
        f" {len(chosen)} sources; {len(skipped)} rows not"
        " expressible (reasons in tests/fixtures/vram_calibration.py)"
    )
    print(
        f"Shipped constants: CUDA context {DEFAULT_OVERHEADS.cuda_context_gb} GB, allocator"
        f" {DEFAULT_OVERHEADS.allocator_fraction:.0%} of transient tensors, set by hand in the commit that added the"
        " CSV (every row may have informed them); nothing else is fitted."
    )
    _print_scores("All rows:", {k.split(",")[0]: v for k, v in results.items() if k.endswith(", all")})
    _print_scores("Single GPU:", {k.split(",")[0]: v for k, v in results.items() if k.endswith("single GPU")})
    _print_scores("Multi-GPU:", {k.split(",")[0]: v for k, v in results.items() if k.endswith("multi-GPU")})
    _print_sources(rows, held_out, chosen)
    latency = median_interleaved(
        {
            "plan": [
                PYTHON,
                "-c",
                "from desktop.cli import main; main(['plan', '--model', 'llama-3.1-8b', '--json']); print('done')",
            ],
            "python": [PYTHON, "-c", "print('done')"],
        },
        "done",
        7,
        {},
    )
    ours, theirs = results["rentune out of sample, all"], results["llama-factory, all"]
    beats = all(
        ours["median"] < results[f"{name}, all"]["median"] and ours["within25"] > results[f"{name}, all"]["within25"]
        for name in ("llama-factory", "accelerate")
    )
    ours_multi = results["rentune out of sample, multi-GPU"]
    return print_table(
        [
            Row(
                "out-of-sample median |error| (%)",
                ours["median"],
                theirs["median"],
                "%",
                "<= 12 %",
                ours["median"] <= 12,
            ),
            Row(
                "out of sample within ±25 % (%)",
                ours["within25"],
                results["accelerate, all"]["within25"],
                "%",
                ">= 90 %",
                ours["within25"] >= 90,
            ),
            Row(
                "multi-GPU median |error| (%)",
                ours_multi["median"],
                results["llama-factory, multi-GPU"]["median"],
                "%",
                "<= 12 %",
                ours_multi["median"] <= 12,
            ),
            Row("OOM rows predicted to fit", ours["false_fits"], None, "", "0", ours["false_fits"] == 0),
            Row("beats every rule of thumb (1 = yes)", float(beats), None, "", "1", beats),
            Row(
                "rentune plan, cold process (s)",
                latency["plan"],
                latency["python"],
                "s",
                "< 0.3 s",
                latency["plan"] < 0.3,
            ),
        ]
    )
