"""Where the base model's weights are read: on every rank, or under FSDP on rank 0 alone.

An FSDP run is launched with ``--fsdp_cpu_ram_efficient_loading true --fsdp_sync_module_states true``
(:func:`trainer_payload.train.launch_options`): rank 0 reads the weights, every other rank builds the model's shape
with empty parameters (on the meta device: no file opened, no host memory), and FSDP copies rank 0's weights into
them when it shards the model. A rank knows which one it is only once the process group exists, so the group is set
up before the model loads (:func:`join_process_group`). transformers 5 does not skip the read by itself: its
``from_pretrained`` reads every weight on every rank even then (only buffers get special handling), so the empty
model is built here (:func:`empty_model`).

QLoRA is the exception: its 4-bit weights are quantised on each rank's own GPU as they load, and the quantisation
state (each block's scale) lives beside the packed weights, where FSDP's copy from rank 0 does not reach (transformers
and accelerate both leave quantised models out of rank-0 loading). Under FSDP the packed weights are stored in the
compute dtype, so FSDP can flatten and shard them with the other parameters, and no ``device_map`` is given:
bitsandbytes places them on the rank's current GPU, which the process group's set-up chose.
"""

from __future__ import annotations

import os
from typing import Any

from trainer_payload.hardware import cuda_available
from trainer_payload.protocol import JobSpec


def sharded_with_fsdp(spec: JobSpec) -> bool:
    """Whether the job's model is sharded by FSDP: strategy ``fsdp`` on more than one GPU (one GPU wraps nothing)."""
    return spec.strategy == "fsdp" and spec.num_gpus * spec.num_nodes > 1


def join_process_group(training_args: Any) -> None:
    """Sets up this rank's device and process group before the model loads, as the trainer will use them.

    ``TrainingArguments.device`` starts accelerate's ``PartialState`` with the trainer's own backend and timeout (the
    trainer later finds the group there and keeps it) and makes the rank's GPU the current one. A single process has
    no group to join; only its device is chosen.
    """
    _ = training_args.device


def starts_empty(spec: JobSpec) -> bool:
    """Whether this rank builds the model without reading its weights: every rank but 0 under FSDP, QLoRA aside.

    Keyed on what accelerate's launcher tells the ranks (``ACCELERATE_USE_FSDP``, ``FSDP_CPU_RAM_EFFICIENT_LOADING``)
    through transformers' own test, which also needs the process group to exist.
    """
    if spec.method == "qlora":
        return False
    import torch.distributed as dist
    from transformers.modeling_utils import is_fsdp_enabled

    return bool(is_fsdp_enabled()) and dist.get_rank() != 0


def empty_model(base_model: str, dtype: Any) -> Any:
    """The model's shape without its weights: parameters on the meta device, buffers computed from the config.

    The buffers (rotary frequencies) are real and small; FSDP overwrites parameters and buffers with rank 0's.
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_model), dtype=dtype)


def quantization_config(spec: JobSpec, dtype: Any) -> Any:
    """QLoRA's 4-bit NF4 settings; under FSDP the packed weights are stored in the compute dtype."""
    from transformers import BitsAndBytesConfig

    storage = {"bnb_4bit_quant_storage": dtype} if sharded_with_fsdp(spec) else {}
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        **storage,
    )


def load_options(spec: JobSpec, dtype: Any) -> dict[str, Any]:
    """``from_pretrained`` options: the dtype; for QLoRA its 4-bit settings and (outside FSDP) the rank's device."""
    options: dict[str, Any] = {"dtype": dtype}
    if spec.method != "qlora":
        return options
    options["quantization_config"] = quantization_config(spec, dtype)
    if not sharded_with_fsdp(spec):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        options["device_map"] = {"": local if cuda_available() else "cpu"}
    return options
