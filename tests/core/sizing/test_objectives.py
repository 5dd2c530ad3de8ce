"""Sizing by objective: a preference pair puts both answers through the model, DPO's reference model adds a forward
pass (and, beside a full fine-tune, a frozen copy), continued pre-training sizes as SFT."""

from __future__ import annotations

from dataclasses import replace

import pytest

from desktop.core.sizing.architecture import Architecture
from desktop.core.sizing.calibration import JobKind
from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.memory import GB, estimate_memory
from desktop.core.sizing.setup import Method, Objective, Strategy, TrainingSetup
from desktop.core.sizing.throughput import flops_per_token


@pytest.fixture(scope="module")
def qwen7b(catalog: ModelCatalog) -> Architecture:
    arch = catalog.find("qwen2.5-7b")
    assert arch is not None
    return arch


def items(arch: Architecture, setup: TrainingSetup) -> dict[str, float]:
    return estimate_memory(arch, setup).items


@pytest.mark.parametrize("method", [Method.QLORA, Method.LORA, Method.FULL])
def test_a_pair_holds_the_activations_and_logits_of_both_answers(qwen7b: Architecture, method: Method) -> None:
    sft = items(qwen7b, TrainingSetup(method=method))
    for objective in (Objective.DPO, Objective.ORPO):
        pairs = items(qwen7b, TrainingSetup(method=method, objective=objective))
        for name in ("activations", "logits"):
            assert pairs[name] == pytest.approx(2 * sft[name], rel=2e-3), (objective, name)
        assert pairs["weights"] == sft["weights"] and pairs["optimizer"] == sft["optimizer"]
    assert items(qwen7b, TrainingSetup(method=method, objective=Objective.CPT)) == sft, "CPT sizes as SFT"


def test_full_dpo_holds_a_frozen_bf16_reference_copy_sharded_like_the_model(qwen7b: Architecture) -> None:
    full = TrainingSetup(method=Method.FULL, objective=Objective.DPO)
    assert items(qwen7b, full)["reference_model"] * GB == pytest.approx(qwen7b.total_params * 2, rel=1e-3)
    sharded = replace(full, num_gpus=8, strategy=Strategy.FSDP)
    assert items(qwen7b, sharded)["reference_model"] * GB == pytest.approx(qwen7b.total_params * 2 / 8, rel=1e-3)
    for lighter in (replace(full, method=Method.LORA), replace(full, objective=Objective.ORPO)):
        assert items(qwen7b, lighter)["reference_model"] == 0, "the adapter switched off, or no reference at all"


def test_full_dpo_trained_every_epoch_keeps_no_reference_copy_and_the_plan_says_which(qwen7b: Architecture) -> None:
    from desktop.core.sizing.report import _objective_words
    from desktop.services.models.sizing import training_setup

    every_epoch = training_setup("full", {"objective": "dpo", "max_steps": 0})
    capped = training_setup("full", {"objective": "dpo", "max_steps": 200})
    assert every_epoch.reference_precomputed and not capped.reference_precomputed
    assert items(qwen7b, every_epoch)["reference_model"] == 0
    assert items(qwen7b, capped)["reference_model"] * GB == pytest.approx(qwen7b.total_params * 2, rel=1e-3)
    assert not training_setup("lora", {"objective": "dpo", "max_steps": 0}).reference_precomputed, "nothing to do"
    assert "computed once before training (no frozen copy" in _objective_words(every_epoch)
    assert "a frozen copy of the model" in _objective_words(capped)


def test_dpo_adds_the_reference_forward_to_each_tokens_work(qwen7b: Architecture) -> None:
    lora = TrainingSetup(method=Method.LORA)  # forward, backward of activations, checkpoint recompute: 3 passes
    dpo = replace(lora, objective=Objective.DPO)
    assert flops_per_token(qwen7b, dpo) / flops_per_token(qwen7b, lora) == pytest.approx(4 / 3, rel=0.02)
    assert flops_per_token(qwen7b, replace(lora, objective=Objective.ORPO)) == flops_per_token(qwen7b, lora)
    assert dpo.tokens_per_step == 2 * lora.tokens_per_step, "a step of pairs is twice the sequences"


def test_dpo_runs_are_their_own_kind_for_learning_and_old_records_read_as_sft(qwen7b: Architecture) -> None:
    sft, dpo = JobKind.of(qwen7b, TrainingSetup()), JobKind.of(qwen7b, TrainingSetup(objective=Objective.DPO))
    assert sft != dpo and JobKind.from_dict(dpo.as_dict()) == dpo
    recorded_before = {k: v for k, v in sft.as_dict().items() if k != "objective"}
    assert JobKind.from_dict(recorded_before) == sft
