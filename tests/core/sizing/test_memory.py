from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desktop.core.sizing.architecture import Architecture
from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.memory import (
    GB,
    estimate_memory,
    logits_gb,
    optimizer_gb,
    trainable_params,
    weights_gb,
)
from desktop.core.sizing.setup import Attention, Method, Precision, SetupError, Strategy, Targets, TrainingSetup


@pytest.fixture(scope="module")
def llama8b(catalog: ModelCatalog) -> Architecture:
    arch = catalog.find("llama-3.1-8b")
    assert arch is not None
    return arch


@pytest.fixture(scope="module")
def llama2(catalog: ModelCatalog) -> Architecture:
    arch = catalog.find("llama-2-7b")
    assert arch is not None
    return arch


def test_lora_trainable_counts_match_peft(llama8b: Architecture, llama2: Architecture) -> None:
    # PEFT prints these for Llama-3-8B (r=16, all linear) and lit-gpt for Llama-2-7B (r=8, q and v).
    assert trainable_params(llama8b, TrainingSetup(lora_r=16)) == 41_943_040
    assert trainable_params(llama2, TrainingSetup(lora_r=8, targets=Targets.QV)) == 4_194_304
    assert trainable_params(llama8b, TrainingSetup(method=Method.FULL)) == llama8b.total_params


def test_weights_by_method(llama8b: Architecture) -> None:
    n = llama8b.total_params
    assert weights_gb(llama8b, TrainingSetup(method=Method.LORA)) * GB == pytest.approx(2 * n)
    qlora = weights_gb(llama8b, TrainingSetup(method=Method.QLORA)) * GB
    # NF4 + double-quant constants on the linear layers, 16-bit embeddings, LM head and norms.
    expected = llama8b.linear_params * (0.5 + 1 / 64 + 4 / 16384) + (n - llama8b.linear_params) * 2
    assert qlora == pytest.approx(expected)
    no_dq = weights_gb(llama8b, TrainingSetup(method=Method.QLORA, double_quant=False)) * GB
    assert no_dq - qlora == pytest.approx(llama8b.linear_params * (4 / 64 - 1 / 64 - 4 / 16384))


def test_full_finetune_bytes_per_parameter(llama8b: Architecture) -> None:
    n = llama8b.total_params

    def static(setup: TrainingSetup) -> float:
        items = estimate_memory(llama8b, setup).items
        return (items["weights"] + items["gradients"] + items["optimizer"]) * GB / n

    assert static(TrainingSetup(method=Method.FULL)) == pytest.approx(8.0, rel=1e-3)
    assert static(TrainingSetup(method=Method.FULL, precision=Precision.MIXED)) == pytest.approx(20.0, rel=1e-3)
    assert static(TrainingSetup(method=Method.FULL_8BIT)) == pytest.approx(6.0, abs=0.01)
    assert optimizer_gb(llama8b, TrainingSetup(method=Method.LORA)) == 0


def test_logits_are_tokens_times_vocab(llama8b: Architecture) -> None:
    setup = TrainingSetup(seq_len=2048, micro_batch=2)
    assert logits_gb(llama8b, setup) * GB == pytest.approx(4096 * 128_256 * 10)
    assert logits_gb(llama8b, dataclasses.replace(setup, chunked_loss=True)) < logits_gb(llama8b, setup) / 4


def test_eager_attention_adds_quadratic_scores(llama8b: Architecture) -> None:
    sdpa = estimate_memory(llama8b, TrainingSetup(seq_len=4096)).items["activations"]
    eager = estimate_memory(llama8b, TrainingSetup(seq_len=4096, attention=Attention.EAGER)).items["activations"]
    assert eager > sdpa + 1.0


def test_checkpointing_cuts_activations_by_the_layer_count(llama8b: Architecture) -> None:
    on = estimate_memory(llama8b, TrainingSetup()).items["activations"]
    off = estimate_memory(llama8b, TrainingSetup(grad_ckpt=False)).items["activations"]
    assert off > 10 * on


def test_fsdp_shards_weights_and_ddp_copies_them(llama8b: Architecture) -> None:
    one = estimate_memory(llama8b, TrainingSetup(method=Method.LORA))
    ddp = estimate_memory(llama8b, TrainingSetup(method=Method.LORA, num_gpus=4, strategy=Strategy.DDP))
    fsdp = estimate_memory(llama8b, TrainingSetup(method=Method.LORA, num_gpus=4, strategy=Strategy.FSDP))
    assert ddp.items["weights"] == one.items["weights"]
    assert fsdp.items["weights"] == pytest.approx(one.items["weights"] / 4, rel=0.01)
    assert fsdp.per_gpu_total < ddp.per_gpu_total


def test_total_is_the_sum_of_items(llama8b: Architecture) -> None:
    estimate = estimate_memory(llama8b, TrainingSetup())
    assert estimate.per_gpu_total == pytest.approx(sum(estimate.items.values()), abs=0.01)
    assert estimate.items["cuda_context"] > 0


def test_seed_article_ranges_for_8b(llama8b: Architecture) -> None:
    # Seed table (2-4k tokens, small batch, checkpointing): QLoRA 10-16 GB, LoRA 20-28 GB on 8B.
    qlora = estimate_memory(llama8b, TrainingSetup(micro_batch=1)).per_gpu_total
    lora = estimate_memory(llama8b, TrainingSetup(method=Method.LORA, micro_batch=1)).per_gpu_total
    assert 8 <= qlora <= 16
    assert 18 <= lora <= 28


@pytest.mark.parametrize(
    ("field", "value"), [("seq_len", -1), ("micro_batch", 0), ("lora_r", 10**6), ("num_gpus", 100), ("grad_accum", 0)]
)
def test_absurd_settings_are_refused(field: str, value: int) -> None:
    with pytest.raises(SetupError, match="out of range"):
        TrainingSetup(**{field: value})


setups = st.builds(
    TrainingSetup,
    method=st.sampled_from(list(Method)),
    lora_r=st.sampled_from([4, 8, 16, 64]),
    targets=st.sampled_from(list(Targets)),
    seq_len=st.integers(128, 16384),
    micro_batch=st.integers(1, 16),
    grad_ckpt=st.booleans(),
    attention=st.sampled_from(list(Attention)),
)


@settings(max_examples=150, deadline=None)
@given(setup=setups, longer=st.integers(1, 4096), more=st.integers(1, 8))
def test_more_tokens_never_use_less_memory(llama8b: Architecture, setup: TrainingSetup, longer: int, more: int) -> None:
    base = estimate_memory(llama8b, setup).per_gpu_total
    longer_seq = dataclasses.replace(setup, seq_len=min(setup.seq_len + longer, 1_048_576))
    bigger_batch = dataclasses.replace(setup, micro_batch=setup.micro_batch + more)
    assert estimate_memory(llama8b, longer_seq).per_gpu_total >= base
    assert estimate_memory(llama8b, bigger_batch).per_gpu_total >= base


@settings(max_examples=150, deadline=None)
@given(setup=setups, rank_up=st.integers(1, 256))
def test_checkpointing_and_rank_are_monotonic(llama8b: Architecture, setup: TrainingSetup, rank_up: int) -> None:
    with_ckpt = estimate_memory(llama8b, dataclasses.replace(setup, grad_ckpt=True)).per_gpu_total
    without = estimate_memory(llama8b, dataclasses.replace(setup, grad_ckpt=False)).per_gpu_total
    assert with_ckpt <= without
    higher = dataclasses.replace(setup, lora_r=setup.lora_r + rank_up)
    assert estimate_memory(llama8b, higher).per_gpu_total >= estimate_memory(llama8b, setup).per_gpu_total


@settings(max_examples=100, deadline=None)
@given(setup=setups, counts=st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=2, max_size=2, unique=True))
def test_more_gpus_with_fsdp_never_need_more_per_gpu(
    llama8b: Architecture, setup: TrainingSetup, counts: list[int]
) -> None:
    few, many = sorted(counts)
    per_few = estimate_memory(llama8b, setup.with_gpus(few, Strategy.FSDP)).per_gpu_total
    per_many = estimate_memory(llama8b, setup.with_gpus(many, Strategy.FSDP)).per_gpu_total
    assert per_many <= per_few + 1e-6


@settings(max_examples=100, deadline=None)
@given(setup=setups)
def test_model_state_grows_from_qlora_to_lora_to_full(llama8b: Architecture, setup: TrainingSetup) -> None:
    # Activations may differ the other way (PEFT keeps dropout copies of adapted inputs); the model state may not.
    def state(method: Method) -> float:
        items = estimate_memory(llama8b, dataclasses.replace(setup, method=method)).items
        return items["weights"] + items["lora_adapter"] + items["gradients"] + items["optimizer"]

    assert state(Method.QLORA) < state(Method.LORA) < state(Method.FULL_8BIT) < state(Method.FULL)


def test_llama2_70b_full_fsdp_on_8_gpus_lands_near_torchtune(catalog: ModelCatalog) -> None:
    # torchtune's README (0217d44c2): Llama-2-70B full fine-tune, 8 x A100, batch 4 x 4096 tokens, 70.4 GB per GPU.
    # Its optimizer is bitsandbytes' PagedAdamW, whose states live in CUDA unified memory that PyTorch's counters
    # never see, so the comparison leaves them out. Tolerance: torchtune's own reruns of one config differ by up to
    # 19 % (its PR #961: 24.1 GB in the README, 20.2 and 22.3 GB reproduced), so ±25 % is what one figure supports.
    arch = catalog.find("llama-2-70b")
    assert arch is not None
    setup = TrainingSetup(method=Method.FULL, seq_len=4096, micro_batch=4, grad_accum=1, num_gpus=8)
    estimate = estimate_memory(arch, setup.with_gpus(8, Strategy.FSDP))
    seen_by_torch = estimate.per_gpu_total - estimate.items["optimizer"]
    assert seen_by_torch == pytest.approx(70.4, rel=0.25)
    assert estimate.items["fsdp_buffers"] < 10, "two layers and the root in flight, not a share of all states"


def test_fsdp_holds_the_root_and_two_layers_unsharded(llama8b: Architecture) -> None:
    setup = TrainingSetup(method=Method.LORA, grad_accum=1).with_gpus(4, Strategy.FSDP)
    layer = llama8b.linear_params // llama8b.num_layers + 2 * llama8b.hidden_size
    root = llama8b.embedding_params + llama8b.hidden_size
    assert estimate_memory(llama8b, setup).items["fsdp_buffers"] * GB == pytest.approx((2 * layer + root) * 2, rel=1e-3)
    full = estimate_memory(llama8b, dataclasses.replace(setup, method=Method.FULL)).items["fsdp_buffers"] * GB
    assert full == pytest.approx((2 * layer + root) * 4, rel=1e-3), "a full fine-tune adds their unsharded gradients"


def test_accumulating_under_fsdp_keeps_whole_gradients_only_under_no_sync(llama8b: Architecture) -> None:
    # The payload reduce-scatters after every micro-batch (sync_each_batch): gradients stay sharded while it
    # accumulates. Under no_sync (HF Trainer's and accelerate's default, litgpt's) every GPU adds into whole ones.
    synced = TrainingSetup(method=Method.FULL, grad_accum=4).with_gpus(4, Strategy.FSDP)
    under_no_sync = dataclasses.replace(synced, sync_each_batch=False)
    sharded = estimate_memory(llama8b, synced).items["gradients"] * GB
    whole = estimate_memory(llama8b, under_no_sync).items["gradients"] * GB
    assert sharded == pytest.approx(llama8b.total_params * 2 / 4, rel=1e-3)
    assert whole == pytest.approx(llama8b.total_params * 2, rel=1e-3)
    assert estimate_memory(llama8b, dataclasses.replace(synced, grad_accum=1)).items["gradients"] * GB == sharded


def test_n_nodes_of_g_gpus_need_per_gpu_what_one_node_of_n_times_g_would(llama8b: Architecture) -> None:
    for method, strategy in itertools.product(Method, Strategy):
        base = TrainingSetup(method=method, grad_accum=4)
        for nodes, gpus in ((2, 8), (4, 8), (2, 4), (3, 2)):
            across = estimate_memory(llama8b, base.with_gpus(gpus, strategy, num_nodes=nodes))
            one_node = estimate_memory(llama8b, dataclasses.replace(base.with_gpus(nodes * gpus, strategy)))
            assert across == one_node, (method, strategy, nodes, gpus)
