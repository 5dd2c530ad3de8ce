"""What is being trained and how: the inputs of the estimator besides the architecture and the GPU."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from trainer_payload.protocol import JOB_INT_RANGES, job_default


class Method(StrEnum):
    """Fine-tuning methods."""

    QLORA = "qlora"
    LORA = "lora"
    FULL = "full"
    FULL_8BIT = "full-8bit"

    @property
    def is_peft(self) -> bool:
        """Whether only an adapter is trained (the base stays frozen)."""
        return self in {Method.QLORA, Method.LORA}


class Objective(StrEnum):
    """What the training optimises (the payload's ``objective``)."""

    SFT = "sft"
    DPO = "dpo"
    ORPO = "orpo"
    CPT = "cpt"

    @property
    def sequences_per_example(self) -> int:
        """Sequences one example puts through the model: two for a preference pair, else one.

        TRL puts a pair's chosen and rejected answers in one batch, each padded to the longer.
        """
        return 2 if self in {Objective.DPO, Objective.ORPO} else 1

    @property
    def has_reference(self) -> bool:
        """Whether a frozen reference model scores every pair too (DPO; ORPO needs none)."""
        return self is Objective.DPO


class Targets(StrEnum):
    """Which linear layers LoRA adapts."""

    ALL_LINEAR = "all-linear"
    ATTENTION = "attention"
    QV = "q,v"


class Strategy(StrEnum):
    """How several GPUs share the work."""

    DDP = "ddp"
    FSDP = "fsdp"


class Precision(StrEnum):
    """What a trainer keeps per parameter.

    ``bf16`` is what Rentune's payload does (TRL with a model loaded in bf16: weights, grads and AdamW states in
    bf16). ``mixed`` keeps fp32 master weights and fp32 states (bf16 autocast over an fp32 model).
    """

    BF16 = "bf16"
    MIXED = "mixed"


class Attention(StrEnum):
    """The attention kernel; SDPA and FlashAttention never store the L x L score matrix."""

    SDPA = "sdpa"
    EAGER = "eager"


class SetupError(ValueError):
    """A training setting outside what can be trained; front ends name the setting their own way.

    Attributes:
        setting: The :class:`TrainingSetup` field (``seq_len``, ``num_gpus``, ...).
        value: The value given.
        problem: What is wrong with it, without the setting's name (``is out of range: use ...``).
    """

    def __init__(self, setting: str, value: object, problem: str) -> None:
        super().__init__(f"{setting} {value!r} {problem}")
        self.setting, self.value, self.problem = setting, value, problem


#: The whole-number settings and their allowed range (lowest, highest): the payload's, so that nothing the app
#: accepts is refused on the machine.
SETTING_RANGES: dict[str, tuple[int, int]] = {
    key: JOB_INT_RANGES[key] for key in ("lora_r", "seq_len", "micro_batch", "grad_accum", "num_gpus", "num_nodes")
}


@dataclass(frozen=True)
class TrainingSetup:
    """Training settings that drive memory and time. Defaults follow the product's seeds.

    Attributes:
        method: QLoRA, LoRA, full, or full with an 8-bit optimizer.
        lora_r: LoRA rank.
        targets: Which linear layers get adapters.
        lora_dropout: Dropout on the adapter input (PEFT then keeps a copy of each adapted input).
        seq_len: Tokens per example after truncation or packing.
        micro_batch: Examples per GPU per forward pass.
        grad_accum: Micro-batches per optimizer step.
        grad_ckpt: Gradient (activation) checkpointing.
        precision: Precision policy (see :class:`Precision`).
        attention: Attention kernel.
        double_quant: QLoRA double quantisation of the NF4 constants.
        num_gpus: GPUs used on each machine.
        strategy: DDP (a full copy per GPU) or FSDP/ZeRO-3 (sharded over every GPU of every machine).
        chunked_loss: Cross-entropy computed in chunks (no full fp32 logits tensor).
        num_nodes: Machines, each with ``num_gpus`` GPUs.
        sync_each_batch: FSDP reduce-scatters gradients after every micro-batch (the payload does); ``False`` is
            accumulation under ``no_sync`` (whole gradients on every GPU until the last micro-batch), what other
            trainers measured in published tables do.
        objective: SFT, DPO, ORPO or continued pre-training. A preference pair's two answers both go through the
            model: its tokens (the workload's, and ``seq_len``) count each side, so a micro-batch of pairs holds
            twice the sequences; DPO's reference model adds a forward pass, and for a full fine-tune a frozen copy.
        reference_precomputed: A full fine-tune's DPO computes the reference log-probabilities once before training
            instead of keeping the frozen copy (``trainer_payload.protocol.precomputes_reference``): no copy in
            memory; the pass over the pairs costs about what the reference's forward costs per step over one epoch.
    """

    method: Method = Method.QLORA  # members, not lookups (RUF009): a test holds the enums equal to the payload's
    lora_r: int = job_default("lora_r")
    targets: Targets = Targets.ALL_LINEAR
    lora_dropout: float = job_default("lora_dropout")
    seq_len: int = job_default("seq_len")
    micro_batch: int = job_default("micro_batch")
    grad_accum: int = job_default("grad_accum")
    grad_ckpt: bool = job_default("gradient_checkpointing")
    precision: Precision = Precision.BF16
    attention: Attention = Attention.SDPA
    double_quant: bool = True
    num_gpus: int = job_default("num_gpus")
    strategy: Strategy = Strategy.DDP
    chunked_loss: bool = False
    num_nodes: int = job_default("num_nodes")
    sync_each_batch: bool = True
    objective: Objective = Objective.SFT
    reference_precomputed: bool = False

    def __post_init__(self) -> None:
        for setting, (low, high) in SETTING_RANGES.items():
            _check_range(setting, getattr(self, setting), low, high)
        if not 0 <= self.lora_dropout < 1:
            raise SetupError("lora_dropout", self.lora_dropout, "must be at least 0 and below 1")

    @property
    def tokens_per_micro_batch(self) -> int:
        """Tokens in one forward pass on one GPU (both answers of each pair for a preference objective)."""
        return self.seq_len * self.micro_batch * self.objective.sequences_per_example

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over all GPUs."""
        return self.tokens_per_micro_batch * self.grad_accum * self.world_size

    @property
    def world_size(self) -> int:
        """GPUs over all machines: the ranks of the run."""
        return self.num_gpus * self.num_nodes

    def with_gpus(self, num_gpus: int, strategy: Strategy, num_nodes: int = 1) -> TrainingSetup:
        """Returns the same setup on another GPU count (per machine), strategy and machine count."""
        return replace(self, num_gpus=num_gpus, strategy=strategy, num_nodes=num_nodes)


def _check_range(setting: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SetupError(setting, value, f"is out of range: use a whole number from {low:,} to {high:,}")


#: The default training setup: the one source of the sized settings' defaults (the CLI, the wizard, the draft).
DEFAULT_SETUP = TrainingSetup()
