"""Several machines: when one machine of 8 GPUs cannot train a job, the plan proposes the fewest that can."""

from __future__ import annotations

import dataclasses

import pytest

from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.core.sizing.plan import Workload, make_plan
from desktop.core.sizing.report import plan_dict, plan_text
from desktop.core.sizing.setup import Method, Strategy, TrainingSetup
from desktop.core.sizing.throughput import inter_node_bytes_per_micro_batch, network_efficiency, tokens_per_s

FULL = TrainingSetup(method=Method.FULL)


def one(gpus: list[GpuSpec], name: str) -> GpuSpec:
    found = find_gpu(gpus, name)
    assert found is not None
    return found


def test_a_70b_full_finetune_that_one_h100_machine_cannot_hold_gets_two_machines(
    catalog: ModelCatalog, gpus: list[GpuSpec]
) -> None:
    arch, h100 = catalog.find("llama-2-70b"), one(gpus, "h100-sxm")
    assert arch is not None
    plan = make_plan(arch, FULL, [h100], Workload(), max_nodes=8)
    by_shape = {(o.nodes, o.count): o for o in plan.options}
    assert not by_shape[(1, 8)].fits
    two = by_shape[(2, 8)]
    assert two.fits and two.strategy is Strategy.FSDP and two.total_gpus == 16
    assert two.cost_usd == pytest.approx(two.hours * h100.list_price_usd_per_h * 16, rel=1e-3)
    assert plan.options[0] is two, "the only option that fits comes first"
    assert (4, 8) not in by_shape, "the fewest machines that fit, not every count"
    text = plan_text(plan, "default", lambda s: "")
    assert "2 machines x 8 x H100 SXM fsdp" in text
    # 87.3 and 83.3 decimal GB, said in GiB like the card's own 80
    assert "one machine of 8 x H100 SXM fsdp needs 81.3 GiB per GPU of 77.6 GiB usable" in text
    assert "3200 Gb/s infiniband between them" in text and f"${two.cost_usd:,.2f}" in text
    assert "Nothing fits on one machine as configured" in text
    listed = plan_dict(plan, "default")["options"][0]
    assert listed["nodes"] == 2 and listed["inter_node"] == "infiniband 3200 Gb/s"


def test_no_machines_are_added_when_one_fits_or_when_the_user_says_one(
    catalog: ModelCatalog, gpus: list[GpuSpec]
) -> None:
    arch, h100 = catalog.find("llama-2-70b"), one(gpus, "h100-sxm")
    assert arch is not None
    assert all(o.nodes == 1 for o in make_plan(arch, FULL, [h100], Workload(), max_nodes=1).options)
    qlora = make_plan(arch, TrainingSetup(), [h100], Workload(), max_nodes=8)
    assert all(o.nodes == 1 for o in qlora.options), "QLoRA fits one machine in under a working day"
    ddp = make_plan(arch, FULL, [h100], Workload(), strategy=Strategy.DDP, max_nodes=8)
    assert all(o.nodes == 1 for o in ddp.options), "machines are only added under FSDP"


def test_a_slow_network_costs_speed_and_a_fast_one_none(catalog: ModelCatalog, gpus: list[GpuSpec]) -> None:
    arch = catalog.find("llama-2-70b")
    assert arch is not None
    across = FULL.with_gpus(8, Strategy.FSDP, num_nodes=2)
    h100, rtx4090 = one(gpus, "h100-sxm"), one(gpus, "rtx4090")
    assert network_efficiency(arch, across, h100) == 1.0
    slow = network_efficiency(arch, across, rtx4090)
    assert 0.5 < slow < 0.95
    single = tokens_per_s(arch, FULL.with_gpus(8, Strategy.FSDP), rtx4090)
    assert tokens_per_s(arch, across, rtx4090) == pytest.approx(2 * single * slow)
    # Each machine moves half (N-1 of N) of two weight gathers and one gradient reduce-scatter per micro-batch.
    assert inter_node_bytes_per_micro_batch(arch, across) == pytest.approx(3 * arch.total_params * 2 / 2, rel=1e-3)
    assert inter_node_bytes_per_micro_batch(arch, FULL.with_gpus(8, Strategy.FSDP)) == 0


def test_ddp_across_machines_moves_only_the_adapter_gradients_once_a_step(catalog: ModelCatalog) -> None:
    arch = catalog.find("llama-2-70b")
    assert arch is not None
    lora = dataclasses.replace(TrainingSetup(method=Method.LORA), grad_accum=4).with_gpus(8, Strategy.DDP, 2)
    moved = inter_node_bytes_per_micro_batch(arch, lora)
    assert 0 < moved < 1e9, "hundreds of MB of fp32 adapter gradients, not the 138 GB of weights"
