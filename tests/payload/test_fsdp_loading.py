"""FSDP as intended: the process group exists before the model loads, so rank 0 alone reads the weights and the
other ranks start empty; QLoRA under FSDP stores its 4-bit weights in the compute dtype and uses no ``device_map``.

The two ranks run under ``accelerate launch`` with the payload's own launch options, on this CPU over gloo: the load
path is the payload's. FSDP's wrapping itself (and its copy of rank 0's weights into the empty ranks) needs GPUs:
accelerate refuses an FSDP plugin without one, and torch's ``sync_module_states`` wants CUDA tensors. That part runs
in ``make gpu-check`` (tests/gpu/fsdp_check.py) on a machine with two GPUs or more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import TinyModel
from tests.payload.conftest import payload_env
from tests.payload.fsdp_load_probe import REPO, launch, rank_reports, write_fsdp_job
from trainer_payload.protocol import JobSpec

JOB = {"base_model": "m", "train_file": "t.jsonl", "output_dir": "out"}


@pytest.mark.slow
def test_under_fsdp_only_rank_zero_reads_the_weights_and_the_other_rank_starts_empty(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    write_chat_dataset(tmp_path / "train.jsonl", count=16)
    lora = write_fsdp_job(tmp_path, "lora", tiny_model.path, method="lora")
    qlora = write_fsdp_job(tmp_path, "qlora", tiny_model.path, method="qlora")
    result = launch([lora, qlora], tmp_path, payload_env() | {"PYTHONPATH": str(REPO)}, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    head, other = rank_reports(tmp_path, lora)
    assert head["world_size"] == other["world_size"] == 2
    assert head["opened"] == ["safe_open model.safetensors"] and head["equal_to_file"], "rank 0 reads the weights"
    assert other["opened"] == [], "rank 1 opened the weights file: the model loaded before the ranks knew their rank"
    assert {p["device"] for p in other["params"].values()} == {"meta"}, "rank 1 holds no weights"
    shapes = {name: (p["shape"], p["dtype"]) for name, p in head["params"].items()}
    assert {name: (p["shape"], p["dtype"]) for name, p in other["params"].items()} == shapes, "the same model, empty"
    assert other["buffers"] == head["buffers"] and head["buffers"], "the rotary frequencies are real on every rank"

    for report in rank_reports(tmp_path, qlora):  # each rank quantises its own 4-bit weights as it loads them
        assert report["opened"] == ["safe_open model.safetensors"]
        packed = [p for p in report["params"].values() if p["kind"] == "Params4bit"]
        assert packed and {p["dtype"] for p in packed} == {"float32"}, "stored in the compute dtype (fp32 on a CPU)"
        assert {p["device"] for p in report["params"].values()} == {"cpu"}


def test_qlora_under_fsdp_stores_its_4bit_weights_in_the_compute_dtype_and_gives_no_device_map() -> None:
    """FSDP flattens the packed weights with the bf16 parameters, and places the model itself."""
    import torch

    from trainer_payload.loading import load_options

    spec = JobSpec.from_dict({**JOB, "method": "qlora", "num_gpus": 4, "strategy": "fsdp"})
    options = load_options(spec, torch.bfloat16)
    config = options["quantization_config"]
    assert config.bnb_4bit_quant_storage == config.bnb_4bit_compute_dtype == torch.bfloat16
    assert options["dtype"] == torch.bfloat16 and "device_map" not in options
    across = {**JOB, "method": "qlora", "num_gpus": 1, "num_nodes": 2, "head_address": "h", "strategy": "fsdp"}
    across_fsdp = load_options(JobSpec.from_dict(across), torch.float32)
    assert across_fsdp["quantization_config"].bnb_4bit_quant_storage == torch.float32
    assert "device_map" not in across_fsdp


def test_qlora_outside_fsdp_keeps_its_packed_bytes_and_its_rank_device() -> None:
    """DDP and one GPU are unchanged: uint8 storage (bitsandbytes' default), each rank on its own device."""
    import torch

    from trainer_payload.loading import load_options

    for keys in ({"num_gpus": 2, "strategy": "ddp"}, {"num_gpus": 1, "strategy": "fsdp"}):
        options = load_options(JobSpec.from_dict({**JOB, "method": "qlora", **keys}), torch.bfloat16)
        assert options["quantization_config"].bnb_4bit_quant_storage == torch.uint8
        assert options["device_map"] == {"": "cpu"}  # this machine has no GPU; on one it is the rank's index
    lora = JobSpec.from_dict({**JOB, "method": "lora", "strategy": "fsdp", "num_gpus": 2})
    assert load_options(lora, torch.float32) == {"dtype": torch.float32}


def test_a_rank_reads_the_weights_while_no_process_group_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher says is not enough: before the group exists a rank cannot tell it is not rank 0."""
    import torch.distributed as dist

    from trainer_payload.loading import starts_empty

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not dist.is_initialized()
    assert not starts_empty(JobSpec.from_dict({**JOB, "method": "lora", "strategy": "fsdp", "num_gpus": 2}))
