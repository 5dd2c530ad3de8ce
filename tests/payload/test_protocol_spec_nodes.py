"""The job keys of a run across several machines: each node's rank, and the head every rank reaches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainer_payload.protocol import JobSpec, JobSpecError

JOB = {"base_model": "m", "train_file": "t.jsonl", "output_dir": "out"}


def test_a_node_rank_at_or_above_the_machine_count_is_refused() -> None:
    with pytest.raises(JobSpecError, match="node_rank 2 must be below num_nodes 2"):
        JobSpec.from_dict({**JOB, "num_nodes": 2, "node_rank": 2, "head_address": "10.65.0.2"})


@pytest.mark.parametrize("address", ["", "--main_process_port=1", "10.0.0.1; rm -rf /", "a b"])
def test_several_machines_need_a_plain_head_address(address: str) -> None:
    with pytest.raises(JobSpecError, match="head_address"):
        JobSpec.from_dict({**JOB, "num_nodes": 2, "head_address": address})


def test_the_launch_options_name_every_machine_and_shard_with_rank_zero_loading() -> None:
    from trainer_payload.train import launch_options

    spec = JobSpec.from_dict(
        {**JOB, "num_gpus": 8, "num_nodes": 2, "node_rank": 1, "head_address": "10.65.0.2", "strategy": "fsdp"}
    )
    options = launch_options(spec)
    pairs = dict(zip(options[::2], options[1::2], strict=False))
    assert pairs["--num_processes"] == "16" and pairs["--num_machines"] == "2" and pairs["--machine_rank"] == "1"
    assert pairs["--main_process_ip"] == "10.65.0.2" and pairs["--main_process_port"] == "29500"
    assert options[options.index("--fsdp_cpu_ram_efficient_loading") + 1] == "true"
    assert options[options.index("--fsdp_sync_module_states") + 1] == "true"
    assert options[options.index("--fsdp_state_dict_type") + 1] == "FULL_STATE_DICT", "an adapter: whole"
    full_across = launch_options(replace(spec, method="full"))
    assert full_across[full_across.index("--fsdp_state_dict_type") + 1] == "SHARDED_STATE_DICT", "parts come home"
    one_machine = launch_options(JobSpec.from_dict({**JOB, "num_gpus": 8, "strategy": "fsdp"}))
    full = launch_options(JobSpec.from_dict({**JOB, "num_gpus": 8, "strategy": "fsdp", "method": "full"}))
    assert one_machine[one_machine.index("--fsdp_state_dict_type") + 1] == "FULL_STATE_DICT", "an adapter: whole"
    assert full[full.index("--fsdp_state_dict_type") + 1] == "SHARDED_STATE_DICT", "a full fine-tune, one machine"
    assert one_machine[one_machine.index("--main_process_port") + 1] == "0", "a free port, found at launch"


def test_fsdp_reduce_scatters_every_micro_batch_and_every_machine_keeps_whole_checkpoints() -> None:
    """What the sizing counts: gradients sharded while accumulating (no whole no_sync copies on every GPU)."""
    from trainer_payload.train import _sft_config

    fsdp = JobSpec.from_dict({**JOB, "num_gpus": 8, "num_nodes": 2, "head_address": "h", "strategy": "fsdp"})
    config = _sft_config(fsdp, bf16=False, has_eval=False)
    assert config.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}
    assert config.save_on_each_node
    ddp = _sft_config(JobSpec.from_dict({**JOB, "num_gpus": 2}), bf16=False, has_eval=False)
    assert ddp.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": False}
    assert not ddp.save_on_each_node


def test_the_final_save_under_fsdp_gathers_whole_weights_and_ddp_is_left_alone() -> None:
    """transformers' save_model writes nothing under FSDP with a sharded state dict: the last save asks for a
    full one (gathered on rank 0), as accelerate documents for "train sharded, save full"."""
    from types import SimpleNamespace

    from trainer_payload.train import gather_whole_weights

    asked: list[str] = []
    plugin = SimpleNamespace(set_state_dict_type=asked.append)
    trainer = SimpleNamespace(accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))
    fsdp = JobSpec.from_dict({**JOB, "num_gpus": 8, "num_nodes": 2, "head_address": "h", "strategy": "fsdp"})
    gather_whole_weights(trainer, fsdp)
    gather_whole_weights(trainer, JobSpec.from_dict({**JOB, "num_gpus": 2}))
    gather_whole_weights(trainer, JobSpec.from_dict({**JOB, "strategy": "fsdp"}))  # one GPU: no FSDP wrapping at all
    assert asked == ["FULL_STATE_DICT"]


def test_only_a_full_fine_tune_under_fsdp_keeps_sharded_checkpoints() -> None:
    """Both sides read this: the payload to choose FSDP's state dict, the app to know a node's part is needed."""
    from trainer_payload.protocol import METHODS, sharded_checkpoints

    assert [method for method in METHODS if sharded_checkpoints(method, "fsdp")] == ["full", "full-8bit"]
    assert not any(sharded_checkpoints(method, "ddp") for method in METHODS)
