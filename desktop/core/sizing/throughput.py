"""Training speed from FLOPs: tokens per second per GPU and multi-GPU scaling.

A training token costs ``2·N`` FLOPs forward per matmul parameter, ``2·N`` backward for the activation gradients,
another ``2·N`` for weight gradients in a full fine-tune (frozen LoRA bases skip them), and one more forward when
checkpointing recomputes it; causal attention adds ``2·L·seq·d`` per pass. Achievable MFU per GPU type comes from
``gpus.json`` (calibrated on the planning values in the product's sizing notes).

Several machines: each trains as one machine of ``num_gpus`` would, and the network between them
(``inter_node_gbps`` per machine in ``gpus.json``) carries what the collectives move across machines. FSDP
all-gathers the weights twice per micro-batch (forward and backward) and reduce-scatters the gradients after each
(``sync_each_batch``); DDP all-reduces the trainable gradients once per optimizer step. The network works while the
GPUs compute (FSDP prefetches the next layer), so only the part of its time beyond the compute time is lost.
"""

from __future__ import annotations

import math
from dataclasses import replace

from desktop.core.sizing.architecture import Architecture
from desktop.core.sizing.gpus import GpuSpec
from desktop.core.sizing.memory import GB, trainable_params, weights_gb
from desktop.core.sizing.setup import Method, Strategy, TrainingSetup

# bitsandbytes dequantises every NF4 weight on each pass: QLoRA runs at about 85 % of LoRA's speed.
QLORA_SPEED_FACTOR = 0.85
# Below ~4k hidden units the kernels are too small to reach the card's MFU.
SMALL_MODEL_HIDDEN = 4096
# Speed-up of N data-parallel GPUs over one (seed articles: ~1.8x on 2, ~3.5x on 4).
_DDP_SCALING = {1: 1.0, 2: 1.8, 4: 3.5, 8: 6.8}
# Sharding moves weights every step: fast links keep most of the speed, PCIe cards much less.
_FSDP_EFFICIENCY = {True: 0.85, False: 0.6}
# What collectives reach of a network's line rate between machines (NCCL over RDMA or sockets).
NETWORK_EFFICIENCY = 0.8
# Bytes per trainable gradient element: bf16 for full fine-tunes, fp32 for PEFT adapters.
_GRAD_BYTES = {True: 4.0, False: 2.0}


def flops_per_token(arch: Architecture, setup: TrainingSetup) -> float:
    """Training FLOPs per token (forward, backward and checkpoint recompute; DPO's reference forward too)."""
    matmul_params = arch.num_layers * arch.active_block_linear_params() + arch.vocab_size * arch.hidden_size
    passes = 2 + (0 if setup.method.is_peft else 1) + (1 if setup.grad_ckpt else 0)
    attention_forward = 2 * arch.num_layers * setup.seq_len * arch.q_width  # QK^T and AV, causal half
    forward_passes = 3 + (1 if setup.grad_ckpt else 0)
    if setup.objective.has_reference:  # the reference model's log-probabilities: one more forward, no backward
        passes, forward_passes = passes + 1, forward_passes + 1
    return 2.0 * matmul_params * passes + attention_forward * forward_passes


def single_gpu_tokens_per_s(arch: Architecture, setup: TrainingSetup, gpu: GpuSpec) -> float:
    """Tokens per second one GPU of this type trains."""
    mfu = gpu.mfu * min(1.0, math.sqrt(arch.hidden_size / SMALL_MODEL_HIDDEN))
    if setup.method is Method.QLORA:
        mfu *= QLORA_SPEED_FACTOR
    return mfu * gpu.bf16_tflops * 1e12 / flops_per_token(arch, setup)


def scaling_factor(num_gpus: int, strategy: Strategy, gpu: GpuSpec) -> float:
    """How many single GPUs ``num_gpus`` of this type are worth together."""
    known = max(n for n in _DDP_SCALING if n <= num_gpus)
    factor = _DDP_SCALING[known] * num_gpus / known
    if not gpu.fast_interconnect and num_gpus > 1:
        factor *= 0.9
    if strategy is Strategy.FSDP and num_gpus > 1:
        factor *= _FSDP_EFFICIENCY[gpu.fast_interconnect]
    return factor


def one_node_tokens_per_s(arch: Architecture, setup: TrainingSetup, gpu: GpuSpec) -> float:
    """Tokens per second of one machine with ``setup.num_gpus`` GPUs."""
    return single_gpu_tokens_per_s(arch, setup, gpu) * scaling_factor(setup.num_gpus, setup.strategy, gpu)


def inter_node_bytes_per_micro_batch(arch: Architecture, setup: TrainingSetup) -> float:
    """Bytes each machine exchanges with the others per micro-batch: (N-1)/N of what the collectives move."""
    if setup.num_nodes == 1:
        return 0.0
    whole = replace(setup, num_gpus=1, num_nodes=1, strategy=Strategy.DDP)
    gradients = trainable_params(arch, setup) * _GRAD_BYTES[setup.method.is_peft]
    if setup.strategy is Strategy.FSDP:
        moved = 2 * weights_gb(arch, whole) * GB + gradients
    else:
        moved = 2 * gradients / setup.grad_accum  # one all-reduce per step, spread over its micro-batches
    return moved * (setup.num_nodes - 1) / setup.num_nodes


def network_efficiency(arch: Architecture, setup: TrainingSetup, gpu: GpuSpec) -> float:
    """The share of its compute speed a machine keeps when the network's time exceeds the compute time it hides in."""
    if setup.num_nodes == 1:
        return 1.0
    per_gpu = one_node_tokens_per_s(arch, setup, gpu) / setup.num_gpus
    compute_s = setup.tokens_per_micro_batch / per_gpu
    network_s = inter_node_bytes_per_micro_batch(arch, setup) * 8 / (gpu.inter_node_gbps * 1e9 * NETWORK_EFFICIENCY)
    return compute_s / max(compute_s, network_s)


def tokens_per_s(arch: Architecture, setup: TrainingSetup, gpu: GpuSpec) -> float:
    """Tokens per second of the whole job: ``setup.num_nodes`` machines of ``setup.num_gpus`` GPUs."""
    one_node = one_node_tokens_per_s(arch, setup, gpu)
    return one_node * setup.num_nodes * network_efficiency(arch, setup, gpu)
