"""Peak GPU memory of a fine-tune, itemised, per GPU, in decimal GB.

The model follows what PyTorch actually allocates during a training step:

- weights: NF4 with its quantisation constants for QLoRA (embeddings, norms and the LM head stay 16-bit), bf16
  for LoRA and full fine-tunes (fp32 master weights with the ``mixed`` policy);
- LoRA adapters: fp32 weights, gradients and two AdamW states (PEFT upcasts adapters to fp32);
- full fine-tunes: gradients and AdamW states in the parameter dtype (8-bit states for ``full-8bit``);
- activations: what autograd keeps per token and layer (all of it without checkpointing; only the block inputs plus
  one recomputed block with it), including the inputs PEFT copies for LoRA dropout; SDPA/flash attention keeps no
  L x L scores, eager attention does;
- logits: ``tokens x vocab`` in bf16 plus the fp32 upcast the loss makes, and its gradient;
- the CUDA context (not in PyTorch's counters, but on the card) and the caching allocator's fragmentation.

Multi-GPU: DDP keeps a full copy on each GPU (plus gradient buckets for full fine-tunes). FSDP/ZeRO-3 shards
weights, gradients and optimizer states; on top of its shard each GPU holds what is unsharded at the peak: the root
unit (embeddings, LM head) gathered for the whole step, two decoder layers in flight (the one computing and the one
prefetched) and, for full fine-tunes, their unsharded gradients until the reduce-scatter. The payload reduce-scatters
after every micro-batch (accelerate's ``sync_each_batch``), so accumulation keeps gradients sharded too; under
``no_sync`` they would be whole on every GPU until the last micro-batch.

Several machines (``num_nodes``) shard over every GPU of every node: the per-GPU memory of N nodes x G GPUs is the
one-node formula at world size N x G.
"""

from __future__ import annotations

from dataclasses import dataclass

from desktop.core.sizing.architecture import Architecture, LinearShape
from desktop.core.sizing.setup import Attention, Method, Precision, Strategy, Targets, TrainingSetup

GB = 1e9

# NF4: 4 bits per weight; one absmax per 64 weights, stored as fp32 or, with double quantisation, as 8 bits plus one
# fp32 constant per 256 absmax values.
NF4_BYTES = 0.5
NF4_CONSTANTS_BYTES = 4 / 64
NF4_DQ_CONSTANTS_BYTES = 1 / 64 + 4 / (64 * 256)
# Per adapter parameter: fp32 weight + fp32 grad + two fp32 AdamW states.
ADAPTER_BYTES = 16
ADAPTER_GRAD_BYTES = 4
# Bytes per element the loss keeps for the logits: bf16 logits, the fp32 upcast / log-softmax, and the gradient.
LOGITS_BYTES = 10.0
LOGITS_BYTES_CHUNKED = 2.0
# HF RMSNorm keeps its fp32 input (4 B) and the normalised bf16 tensor (2 B) plus its bf16 output (2 B) per unit.
NORM_BYTES_PER_H = 8
# Eager attention per query/key pair and head at the backward peak: bf16 scores, fp32 softmax, bf16
# probabilities, and the fp32 and bf16 gradients of the scores.
EAGER_SCORE_BYTES = 16
# Gemma 2's logit soft-capping keeps fp32 copies of the scaled logits and their tanh.
SOFTCAP_BYTES = 8.0
# FSDP wraps each decoder layer as a unit and, with prefetch (and limit_all_gathers), has two gathered at a time.
FSDP_UNITS_IN_FLIGHT = 2


@dataclass(frozen=True)
class Overheads:
    """The two constants no tensor shape gives; chosen by hand against published measurements.

    Attributes:
        cuda_context_gb: The CUDA context and kernels on the card (not in PyTorch's counters).
        allocator_fraction: What the caching allocator reserves beyond what it hands out, as a share of the step's
            transient tensors (activations and logits).
    """

    cuda_context_gb: float = 0.4
    allocator_fraction: float = 0.08


DEFAULT_OVERHEADS = Overheads()


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory on one GPU, itemised.

    Attributes:
        items: Named terms in decimal GB, in a stable order (zero terms included).
        per_gpu_total: The sum: what one card must hold at the peak of a step.
    """

    items: dict[str, float]
    per_gpu_total: float

    @property
    def context_gb(self) -> float:
        """The CUDA context: on the card, outside the framework's memory counters."""
        return self.items.get("cuda_context", 0.0)

    @property
    def counted_gb(self) -> float:
        """What the framework's counters see at the peak (``max_memory_reserved``): all but the CUDA context."""
        return self.per_gpu_total - self.context_gb


def _param_bytes(setup: TrainingSetup) -> float:
    return 4.0 if setup.precision is Precision.MIXED else 2.0


def _targeted(arch: Architecture, targets: Targets) -> list[LinearShape]:
    shapes = arch.linear_shapes()
    if targets is Targets.ATTENTION:
        return [s for s in shapes if s.attention]
    if targets is Targets.QV:
        return [s for s in shapes if s.name in {"q_proj", "v_proj"}]
    return shapes


def trainable_params(arch: Architecture, setup: TrainingSetup) -> int:
    """Parameters the optimizer updates: the LoRA matrices, or every parameter for full fine-tunes."""
    if not setup.method.is_peft:
        return arch.total_params
    per_block = sum(
        setup.lora_r * (s.in_features + s.out_features) * (arch.num_experts if s.per_expert else 1)
        for s in _targeted(arch, setup.targets)
    )
    return arch.num_layers * per_block


def weights_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """The frozen or trained base weights on one GPU."""
    if setup.method is Method.QLORA:
        constants = NF4_DQ_CONSTANTS_BYTES if setup.double_quant else NF4_CONSTANTS_BYTES
        dense_16bit = arch.embedding_params + arch.norm_params
        total = arch.linear_params * (NF4_BYTES + constants) + dense_16bit * 2.0
    else:
        total = arch.total_params * _param_bytes(setup)
    return total / _shards(setup) / GB


def reference_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """DPO's frozen reference model beside a full fine-tune.

    With an adapter the base with it switched off serves; with the log-probabilities computed before training, no
    copy is kept.
    """
    if not setup.objective.has_reference or setup.method.is_peft or setup.reference_precomputed:
        return 0.0
    return arch.total_params * 2.0 / _shards(setup) / GB  # bf16, sharded like the model under FSDP


def _shards(setup: TrainingSetup) -> int:
    return setup.world_size if setup.strategy is Strategy.FSDP else 1


def _sharded(setup: TrainingSetup) -> bool:
    return setup.strategy is Strategy.FSDP and setup.world_size > 1


def _accumulates_unsharded(setup: TrainingSetup) -> bool:
    """FSDP under ``no_sync``: micro-batches before the last add into whole, unsharded gradients on every GPU."""
    return _sharded(setup) and setup.grad_accum > 1 and not setup.sync_each_batch


def adapter_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """LoRA weights, gradients and optimizer states."""
    if not setup.method.is_peft:
        return 0.0
    trainable = trainable_params(arch, setup)
    sharded = trainable * ADAPTER_BYTES / _shards(setup)
    if _accumulates_unsharded(setup):
        sharded += trainable * ADAPTER_GRAD_BYTES * (1 - 1 / setup.world_size)  # the fp32 gradient, whole
    return sharded / GB


def gradients_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """Full fine-tune gradients.

    Sharded under FSDP when reduce-scattered after every micro-batch (the payload's ``sync_each_batch``); whole on
    every GPU while accumulating under ``no_sync``. DDP adds the all-reduce buckets that copy them.
    """
    if setup.method.is_peft:
        return 0.0
    grads = arch.total_params * _param_bytes(setup)
    if not _accumulates_unsharded(setup):
        grads /= _shards(setup)
    if setup.world_size > 1 and setup.strategy is Strategy.DDP:
        grads *= 2
    return grads / GB


def optimizer_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """Full fine-tune optimizer states (AdamW: two per parameter; ``mixed`` adds the fp32 master copy)."""
    if setup.method.is_peft:
        return 0.0
    if setup.method is Method.FULL_8BIT:
        per_param = 2.0 + 2 * 4 / 2048  # two 8-bit states plus block-wise fp32 scales
    elif setup.precision is Precision.MIXED:
        per_param = 12.0  # fp32 master weights + two fp32 states
    else:
        per_param = 2 * _param_bytes(setup)
    return arch.total_params * per_param / _shards(setup) / GB


def _dropout_copy_elements(arch: Architecture, setup: TrainingSetup) -> int:
    """Per token and block: PEFT applies dropout to each adapted layer's input, and keeps that copy."""
    if not setup.method.is_peft or setup.lora_dropout == 0:
        return 0
    return sum(s.in_features for s in _targeted(arch, setup.targets))


def block_activation_bytes_per_token(arch: Architecture, setup: TrainingSetup) -> float:
    """What autograd keeps for one block and one token without checkpointing.

    bf16: q, k, v and the attention output (what SDPA/flash save), the MLP's gate, up, activation and product
    (up and activation for a non-gated MLP), and the inputs PEFT copies for LoRA dropout. RMSNorm upcasts to fp32
    and keeps the fp32 input and the normalised bf16 copy: about 8 bytes per hidden unit per norm, two norms.
    Eager attention also keeps the scores, their fp32 softmax and its output for every query/key pair.
    """
    mlp = (4 if arch.gated_mlp else 2) * arch.intermediate_size * arch.experts_per_token
    bf16_elements = 2 * arch.q_width + 2 * arch.kv_width + mlp + _dropout_copy_elements(arch, setup)
    norms = (1 if arch.parallel_block else arch.norms_per_block) * NORM_BYTES_PER_H * arch.hidden_size
    scores = 0.0
    if setup.attention is Attention.EAGER:
        scores = arch.num_heads * setup.seq_len * EAGER_SCORE_BYTES
    return bf16_elements * 2 + norms + scores


def activations_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """Activations kept between forward and backward for one micro-batch on one GPU."""
    tokens = setup.tokens_per_micro_batch
    per_block = block_activation_bytes_per_token(arch, setup) * tokens
    if setup.grad_ckpt:
        kept_inputs = arch.num_layers * arch.hidden_size * 2 * tokens
        return (kept_inputs + per_block) / GB
    return arch.num_layers * per_block / GB


def logits_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """The LM head output and the loss's fp32 copies and gradient."""
    per_element = LOGITS_BYTES_CHUNKED if setup.chunked_loss else LOGITS_BYTES
    if arch.logit_softcap:
        per_element += SOFTCAP_BYTES
    return setup.tokens_per_micro_batch * arch.vocab_size * per_element / GB


def _unit_params(arch: Architecture) -> int:
    """One FSDP unit: a decoder layer's linear layers (every expert, the router) and its norms."""
    return arch.linear_params // arch.num_layers + arch.norms_per_block * arch.hidden_size


def _root_params(arch: Architecture) -> int:
    """FSDP's root unit: what lies outside the decoder layers (embeddings, LM head, final norm)."""
    return arch.embedding_params + arch.hidden_size


def _gathered_unit_bytes(arch: Architecture, setup: TrainingSetup) -> float:
    """One decoder layer as all-gathered: NF4 storage for QLoRA, else the bf16 compute copy."""
    if setup.method is not Method.QLORA:
        return _unit_params(arch) * 2.0
    constants = NF4_DQ_CONSTANTS_BYTES if setup.double_quant else NF4_CONSTANTS_BYTES
    linear = arch.linear_params // arch.num_layers
    return linear * (NF4_BYTES + constants) + (_unit_params(arch) - linear) * 2.0


def fsdp_buffers_gb(arch: Architecture, setup: TrainingSetup) -> float:
    """What FSDP holds unsharded on each GPU beyond its shard, at the peak of backward.

    The root unit (embeddings, LM head) is not resharded after forward, so it stays gathered for the whole step;
    two decoder layers are gathered at a time (the one computing and the one prefetched). A full fine-tune also
    holds the unsharded gradients of those units until their reduce-scatter (the root's until the end of
    backward), unless accumulation under ``no_sync`` already keeps every gradient whole (see :func:`gradients_gb`).
    """
    if not _sharded(setup):
        return 0.0
    unit, root = _unit_params(arch), _root_params(arch)
    gathered = FSDP_UNITS_IN_FLIGHT * _gathered_unit_bytes(arch, setup) + root * 2.0
    grads = 0.0
    if not setup.method.is_peft and not _accumulates_unsharded(setup):
        grads = (FSDP_UNITS_IN_FLIGHT * unit + root) * _param_bytes(setup)
    return (gathered + grads) / GB


def estimate_memory(
    arch: Architecture, setup: TrainingSetup, overheads: Overheads = DEFAULT_OVERHEADS
) -> MemoryEstimate:
    """Estimates the peak memory one GPU needs for a training step.

    Args:
        arch: The model.
        setup: Method, shapes, precision and multi-GPU strategy.
        overheads: The hand-chosen constants (other values only to test how much the accuracy owes to them).

    Returns:
        The itemised estimate; ``per_gpu_total`` is what must fit on the card.
    """
    items = {
        "weights": weights_gb(arch, setup),
        "reference_model": reference_gb(arch, setup),
        "lora_adapter": adapter_gb(arch, setup),
        "gradients": gradients_gb(arch, setup),
        "optimizer": optimizer_gb(arch, setup),
        "activations": activations_gb(arch, setup),
        "logits": logits_gb(arch, setup),
        "fsdp_buffers": fsdp_buffers_gb(arch, setup),
    }
    items["allocator_overhead"] = overheads.allocator_fraction * (items["activations"] + items["logits"])
    items["cuda_context"] = overheads.cuda_context_gb
    rounded = {name: round(value, 3) for name, value in items.items()}
    return MemoryEstimate(rounded, round(sum(items.values()), 3))
