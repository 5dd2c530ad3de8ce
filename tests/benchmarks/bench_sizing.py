"""Sizing: Rentune's estimator against the rules of thumb other tools use, on published measurements; plan latency.

Error tables over the expressible rows of tests/data/sizing/vram_measured_public.csv, side by side:
- Rentune: the itemised memory model (``per_gpu_total``);
- LLaMA-Factory README rules (x = billions of parameters): QLoRA x/2, LoRA 2x, full (AMP) 18x GB;
- accelerate ``estimate-memory``: weights + gradients + Adam = 4x the model's size in its load dtype
  (4-bit for QLoRA), batch 1, no activations.
Multi-GPU sharded rows divide the rules' totals by the GPU count (in their favour).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from desktop.core.sizing.memory import estimate_memory
from desktop.core.sizing.setup import Method, Strategy
from desktop.services.model_configs import load_catalog
from tests.benchmarks.common import PYTHON, Row, median_interleaved, print_table
from tests.fixtures.vram_calibration import CalibrationRow, load_calibration

Estimator = Callable[[CalibrationRow], float]


def _shards(row: CalibrationRow) -> int:
    return row.setup.num_gpus if row.setup.strategy is Strategy.FSDP else 1


def rentune(row: CalibrationRow) -> float:
    return estimate_memory(row.arch, row.setup).per_gpu_total


def llama_factory(row: CalibrationRow) -> float:
    x = row.arch.total_params / 1e9
    factor = {Method.QLORA: 0.5, Method.LORA: 2.0, Method.FULL: 18.0, Method.FULL_8BIT: 18.0}[row.setup.method]
    return x * factor / _shards(row)


def accelerate(row: CalibrationRow) -> float:
    bytes_per_param = 0.5 if row.setup.method is Method.QLORA else 2.0
    return 4 * row.arch.total_params * bytes_per_param / 1e9 / _shards(row)


def score(rows: list[CalibrationRow], estimator: Estimator) -> dict[str, float]:
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


def run() -> bool:
    rows, skipped = load_calibration(load_catalog())
    results = {
        name: score(rows, fn)
        for name, fn in (("rentune", rentune), ("llama-factory", llama_factory), ("accelerate", accelerate))
    }
    n = results["rentune"]["n"]
    print(f"{n} measured rows + {sum(r.oom for r in rows)} OOM rows ({len(skipped)} rows not expressible)")
    print(
        f"{'estimator':<16}{'median |err|':>14}{'p90 |err|':>11}{'within ±25%':>13}{'median bias':>13}"
        f"{'OOM called fits':>17}"
    )
    for name, r in results.items():
        print(
            f"{name:<16}{r['median']:>13.1f}%{r['p90']:>10.1f}%{r['within25']:>12.0f}%{r['bias']:>+12.1f}%"
            f"{r['false_fits']:>17.0f}"
        )
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
    ours = results["rentune"]
    beats = all(
        ours["median"] < r["median"] and ours["within25"] > r["within25"]
        for name, r in results.items()
        if name != "rentune"
    )
    return print_table(
        [
            Row(
                "calibration median |error| (%)",
                ours["median"],
                results["llama-factory"]["median"],
                "%",
                "<= 12 %",
                ours["median"] <= 12,
            ),
            Row(
                "rows within ±25 % (%)",
                ours["within25"],
                results["accelerate"]["within25"],
                "%",
                ">= 90 %",
                ours["within25"] >= 90,
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
