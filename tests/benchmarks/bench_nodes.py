"""Several machines: the plan for a 70 B full fine-tune, its multi-machine options, beside published references.

Targets: planned on the 80 GB cards clusters are rented with (H100 SXM, H100 PCIe, A100 80GB; no single machine of
8 holds the job), the plan offers a 2-machine option for the full fine-tune, and the per-GPU memory of N machines x G
GPUs is the one-machine formula at world size N x G.

References, each with how it differs from Rentune's payload (bf16 weights, gradients and AdamW states on the GPU,
FSDP full shard, gradients reduce-scattered after every micro-batch, activation checkpointing, the whole loss):
- torchtune README @30b8519e8: Llama 3.1 70B full, 8 GPUs, seq 2048, batch 2: 13.9 GiB per GPU. It offloads
  parameters, gradients and optimizer states to the CPU (FSDP CPU offload, the step fused into backward): compared
  with what stays on the GPU (activations, loss, gathered layers, context), and its ``CEWithChunkedOutputLoss``
  computes the loss in chunks.
- torchtune README @0217d44c2: Llama 2 70B full, 8 A100s, seq 4096, batch 4: 70.4 GB per GPU, with bitsandbytes'
  paged AdamW, whose states live in unified memory that PyTorch's counters never see: compared without them.
- Hugging Face, "Fine-tuning Llama 2 70B using PyTorch FSDP" (huggingface.co/blog/ram-efficient-pytorch-fsdp,
  2023): a full fine-tune on 2 machines x 8 A100 80GB, FSDP full shard with ``cpu_ram_efficient_loading``, gradient
  checkpointing, Flash Attention 2. It publishes that it fits, not its peak: the row shows Rentune's estimate for
  that shape (seq 2048, batch 1 assumed).
- LLaMA-Factory README's rule for full fine-tunes with AMP, 18 x billions of parameters GB per job, divided over
  the GPUs: fp32 master weights and states (Rentune's ``mixed`` policy, not its payload), no activations.
"""

from __future__ import annotations

from dataclasses import replace

from desktop.core.sizing.memory import estimate_memory
from desktop.core.sizing.plan import Workload, make_plan
from desktop.core.sizing.report import option_name
from desktop.core.sizing.setup import Method, Strategy, TrainingSetup
from desktop.services.models.configs import load_gpus, resolve_model
from tests.benchmarks.common import Row, print_table

FULL = TrainingSetup(method=Method.FULL)


def _references() -> list[tuple[str, str, float | None, float, str]]:
    """(source, shape, published GB per GPU or None, Rentune's comparable estimate, how it differs)."""
    llama3, llama2 = resolve_model("llama-3.1-70b"), resolve_model("llama-2-70b")
    on8 = replace(FULL, seq_len=2048, micro_batch=2, chunked_loss=True).with_gpus(8, Strategy.FSDP)
    torchtune_new = estimate_memory(llama3, on8)
    on8_long = replace(FULL, seq_len=4096, micro_batch=4).with_gpus(8, Strategy.FSDP)
    torchtune_old = estimate_memory(llama2, on8_long)
    blog = estimate_memory(llama2, replace(FULL, seq_len=2048, micro_batch=1).with_gpus(8, Strategy.FSDP, 2))
    return [
        (
            "torchtune @30b8519e8",
            "3.1-70B 8 GPUs L2048 b2",
            13.9 * 1.073741824,
            torchtune_new.per_gpu_total - sum(torchtune_new.items[k] for k in ("weights", "gradients", "optimizer")),
            "offloads weights, grads, states: without them",
        ),
        (
            "torchtune @0217d44c2",
            "2-70B 8xA100 L4096 b4",
            70.4,
            torchtune_old.per_gpu_total - torchtune_old.items["optimizer"],
            "paged AdamW unseen: compared without it",
        ),
        ("HF blog, FSDP 70B", "2-70B 2x8xA100-80 L2048 b1", None, blog.per_gpu_total, "fits on 80 GB; no peak given"),
        ("LLaMA-Factory rule", "70B full AMP / 16 GPUs", None, 18 * 70 / 16, "rule: fp32 master + states"),
    ]


def _print_references() -> None:
    print(f"\n{'reference':<24}{'shape':<30}{'published':>11}{'rentune':>10}  differs")
    for source, shape, published, ours, differs in _references():
        shown = f"{published:.1f}" if published is not None else "-"
        print(f"{source:<24}{shape:<30}{shown:>11}{ours:>10.1f}  {differs}")


def _same_as_one_machine(setup: TrainingSetup) -> bool:
    """N machines x G GPUs per GPU == one machine of N x G, for every method and strategy."""
    model = resolve_model("llama-2-70b")
    for method, strategy in ((m, s) for m in Method for s in Strategy):
        base = replace(setup, method=method)
        for nodes, gpus in ((2, 8), (4, 8), (2, 4)):
            across = estimate_memory(model, base.with_gpus(gpus, strategy, nodes))
            if across != estimate_memory(model, base.with_gpus(nodes * gpus, strategy)):
                return False
    return True


#: The GPU types clusters are rented with (RunPod's Instant Clusters, Lambda's 1-Click Clusters): 80 GB cards.
CLUSTER_GPUS = ("h100-sxm", "a100-80gb", "h100-pcie")


def run() -> bool:
    model = resolve_model("llama-2-70b")
    gpus = [gpu for gpu in load_gpus() if gpu.id in CLUSTER_GPUS]
    plan = make_plan(model, FULL, gpus, Workload(), max_nodes=8)
    print(f"{'option (Llama 2 70B full, seq 2048, batch 2 x 4)':<50}{'GB/GPU':>8}{'tok/s':>9}{'hours':>8}{'cost':>10}")
    for option in plan.options[:12]:
        print(
            f"{option_name(option):<50}{option.memory.per_gpu_total:>8.1f}{option.tokens_per_s:>9,.0f}"
            f"{option.hours:>8.2f}{'$' + format(option.cost_usd, ',.2f'):>10}"
        )
    _print_references()
    two = {o.gpu.id: o for o in plan.options if o.nodes == 2}
    rows = [
        Row("2-machine option for H100 SXM (GB/GPU)", _gb(two.get("h100-sxm")), None, "", "offered", "h100-sxm" in two),
        Row(
            "2-machine option for A100 80GB (GB/GPU)",
            _gb(two.get("a100-80gb")),
            None,
            "",
            "offered",
            "a100-80gb" in two,
        ),
        Row("N x G per GPU == one machine of N*G", 1.0, None, "", "equal", _same_as_one_machine(FULL)),
    ]
    return print_table(rows)


def _gb(option: object) -> float:
    return float(getattr(getattr(option, "memory", None), "per_gpu_total", 0.0))
