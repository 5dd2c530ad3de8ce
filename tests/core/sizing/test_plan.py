from __future__ import annotations

import dataclasses

import pytest

from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.core.sizing.plan import Fit, Workload, make_plan
from desktop.core.sizing.setup import Method, Strategy, TrainingSetup
from desktop.core.sizing.throughput import scaling_factor, tokens_per_s

# Planning values from the product's sizing notes: (model, method, gpu, count, low, high) in tokens/s.
PLANNING = [
    ("llama-3.1-8b", Method.QLORA, "rtx4090", 1, 1000, 2500),
    ("llama-3.1-8b", Method.LORA, "h100-sxm", 1, 5000, 10000),
    ("qwen2.5-32b", Method.QLORA, "l40s", 1, 400, 800),
    ("qwen2.5-32b", Method.QLORA, "h100-sxm", 1, 1200, 2200),
    ("llama-3.3-70b", Method.QLORA, "a100-80gb", 1, 180, 350),
    ("llama-3.3-70b", Method.QLORA, "h100-sxm", 1, 500, 900),
    ("llama-3.1-8b", Method.FULL, "h100-sxm", 4, 15000, 30000),
]


@pytest.mark.parametrize(("model", "method", "gpu_id", "count", "low", "high"), PLANNING)
def test_throughput_lands_in_the_published_ranges(
    catalog: ModelCatalog,
    gpus: list[GpuSpec],
    model: str,
    method: Method,
    gpu_id: str,
    count: int,
    low: int,
    high: int,
) -> None:
    arch, gpu = catalog.find(model), find_gpu(gpus, gpu_id)
    assert arch is not None and gpu is not None
    setup = TrainingSetup(method=method, seq_len=2048).with_gpus(count, Strategy.DDP)
    assert low <= tokens_per_s(arch, setup, gpu) <= high


def test_ddp_scaling_follows_the_seeds(gpus: list[GpuSpec]) -> None:
    h100 = find_gpu(gpus, "H100 SXM")
    assert h100 is not None
    assert scaling_factor(2, Strategy.DDP, h100) == pytest.approx(1.8)
    assert scaling_factor(4, Strategy.DDP, h100) == pytest.approx(3.5)
    assert scaling_factor(4, Strategy.FSDP, h100) < 3.5


def test_plan_ranks_fitting_options_by_cost(catalog: ModelCatalog, gpus: list[GpuSpec]) -> None:
    arch = catalog.find("llama-3.1-8b")
    assert arch is not None
    plan = make_plan(arch, TrainingSetup(), gpus, Workload())
    fitting = [o for o in plan.options if o.fits]
    assert fitting and fitting[0].fit is Fit.FITS
    costs = [o.cost_usd for o in fitting if o.fit is Fit.FITS]
    assert costs == sorted(costs)
    assert not plan.suggestions
    best = fitting[0]
    assert best.hours == pytest.approx(best.setup_hours + best.training_hours + 5 / 60, abs=0.01)
    assert best.cost_usd == pytest.approx(best.hours * best.gpu.list_price_usd_per_h * best.count, abs=0.02)


def test_one_card_is_preferred_when_it_fits_within_a_working_day(catalog: ModelCatalog, gpus: list[GpuSpec]) -> None:
    arch = catalog.find("qwen2.5-0.5b")
    assert arch is not None
    plan = make_plan(arch, TrainingSetup(), gpus, Workload(tokens=1_000_000, epochs=1))
    assert all(o.count == 1 for o in plan.options)


def test_nothing_fits_suggests_the_fixes(catalog: ModelCatalog, gpus: list[GpuSpec]) -> None:
    arch = catalog.find("llama-3.3-70b")
    rtx4090 = find_gpu(gpus, "rtx4090")
    assert arch is not None and rtx4090 is not None
    plan = make_plan(arch, TrainingSetup(method=Method.LORA), [rtx4090], Workload(), counts=(1,))
    assert not any(o.fits for o in plan.options)
    assert plan.suggestions
    for suggestion in plan.suggestions:
        settings = {change.setting: (change.before, change.after) for change in suggestion.changes}
        assert settings["method"] == (Method.LORA, Method.QLORA)
        assert settings["num_gpus"] == (1, 8) and settings["strategy"] == (Strategy.DDP, Strategy.FSDP)
        assert all(change.why and "--" not in change.why for change in suggestion.changes), "the core speaks data"
        assert suggestion.setup.method is Method.QLORA and suggestion.option.fits


def test_spot_rework_grows_with_the_checkpoint_interval(catalog: ModelCatalog, gpus: list[GpuSpec]) -> None:
    arch = catalog.find("llama-3.1-8b")
    assert arch is not None
    often = make_plan(arch, TrainingSetup(), gpus, Workload(checkpoint_minutes=10)).options[0]
    rarely = make_plan(arch, TrainingSetup(), gpus, Workload(checkpoint_minutes=120)).options[0]
    assert rarely.spot_rework_hours > often.spot_rework_hours > 0


def test_70b_full_finetune_fits_8_h200_with_fsdp(catalog: ModelCatalog, gpus: list[GpuSpec]) -> None:
    arch, h200 = catalog.find("llama-2-70b"), find_gpu(gpus, "h200")
    assert arch is not None and h200 is not None
    setup = TrainingSetup(method=Method.FULL, seq_len=4096, micro_batch=4, grad_accum=1)
    plan = make_plan(arch, setup, [h200], Workload(), counts=(8,), strategy=Strategy.FSDP)
    assert plan.options[0].fits


def test_accumulating_full_finetune_under_fsdp_fits_as_the_payload_syncs_every_micro_batch(
    catalog: ModelCatalog, gpus: list[GpuSpec]
) -> None:
    arch, h200 = catalog.find("llama-2-70b"), find_gpu(gpus, "h200")
    assert arch is not None and h200 is not None
    setup = TrainingSetup(method=Method.FULL, seq_len=4096, micro_batch=4, grad_accum=4).with_gpus(8, Strategy.FSDP)
    plan = make_plan(arch, setup, [h200], Workload(), counts=(8,), strategy=Strategy.FSDP)
    assert plan.options[0].fits, "gradients reduce-scattered every micro-batch: sharded, not 138 GB whole"
    under_no_sync = dataclasses.replace(setup, sync_each_batch=False)
    plan = make_plan(arch, under_no_sync, [h200], Workload(), counts=(8,), strategy=Strategy.FSDP)
    assert not any(o.fits for o in plan.options), "138 GB of whole bf16 gradients on each GPU"
    assert any([(c.setting, c.before, c.after) for c in s.changes] == [("grad_accum", 4, 1)] for s in plan.suggestions)
