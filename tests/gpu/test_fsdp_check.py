"""The FSDP pass's verdicts (tests/gpu/fsdp_check.py), read from rank reports shaped as the load probe writes them.

The pass itself needs two GPUs; these check that each way a rank can go wrong is named, and that a right run is ok.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.gpu.fsdp_check import FsdpRow, judge_lora, judge_qlora, render_fsdp, skip_reason

WEIGHTS = {"base_model.model.model.embed_tokens.weight": 4096, "base_model.model.lm_head.weight": 4096}


def param(kind: str, device: str, dtype: str) -> dict[str, Any]:
    """One parameter as the probe describes it."""
    return {"kind": kind, "device": device, "dtype": dtype, "shape": [8, 8]}


def lora_reports() -> list[dict[str, Any]]:
    """Two ranks as they should be: rank 0 read the file, rank 1 started empty, sharding gave both rank 0's bytes."""
    head = {
        "rank": 0,
        "opened": ["safe_open model.safetensors"],
        "equal_to_file": True,
        "params": {"w": param("Parameter", "cpu", "bfloat16")},
        "sharded": {"before": dict(WEIGHTS), "after": dict(WEIGHTS)},
    }
    other = {
        "rank": 1,
        "opened": [],
        "params": {"w": param("Parameter", "meta", "bfloat16")},
        "sharded": {"before": {}, "after": dict(WEIGHTS)},
    }
    return [head, other]


def qlora_reports() -> list[dict[str, Any]]:
    """Two ranks that each quantised on their own GPU, packed weights stored in the compute dtype."""
    reports = []
    for rank in (0, 1):
        params = {
            "q": param("Params4bit", f"cuda:{rank}", "bfloat16"),
            "norm": param("Parameter", f"cuda:{rank}", "bfloat16"),
        }
        opened = ["safe_open model.safetensors"]
        reports.append({"rank": rank, "opened": opened, "params": params, "sharded": {"before": {}, "after": WEIGHTS}})
    reports[0]["sharded"]["before"] = dict(WEIGHTS)
    return reports


def test_a_right_lora_run_is_ok() -> None:
    row = judge_lora(lora_reports())
    assert row.status == "ok" and "2 tensors equal on every rank" in row.detail


def test_a_rank_that_read_the_weights_or_was_not_empty_fails_the_lora_check() -> None:
    read = lora_reports()
    read[1]["opened"] = ["safe_open model.safetensors"]
    assert judge_lora(read).status == "failed: ranks [1] opened the weights file"
    loaded = lora_reports()
    loaded[1]["params"]["w"]["device"] = "cpu"
    assert judge_lora(loaded).status == "failed: ranks [1] hold weights before sharding (not empty)"


def test_an_empty_rank_fsdp_did_not_fill_fails_the_lora_check() -> None:
    reports = lora_reports()
    reports[1]["sharded"]["after"] = {**WEIGHTS, "base_model.model.lm_head.weight": 0}
    status = judge_lora(reports).status
    assert status.startswith("failed: rank 1 after sharding differs from rank 0's weights (1: ['base_model.model.lm_h")


def test_qlora_ranks_on_their_own_gpus_with_weights_in_the_compute_dtype_are_ok() -> None:
    row = judge_qlora(qlora_reports())
    assert row == FsdpRow("qlora", "ok", "each rank quantised on its own GPU, 4-bit weights stored as bfloat16")


def test_qlora_in_packed_bytes_or_on_another_ranks_gpu_fails() -> None:
    packed = qlora_reports()
    packed[1]["params"]["q"]["dtype"] = "uint8"
    assert (
        judge_qlora(packed).status == "failed: rank 1 stores its 4-bit weights as ['uint8'], computes in {'bfloat16'}"
    )
    crowded = copy.deepcopy(qlora_reports())
    for p in crowded[1]["params"].values():
        p["device"] = "cuda:0"  # a device_map of {"": 0}, or no current device set before loading
    assert judge_qlora(crowded).status == "failed: rank 1's weights are on ['cuda:0'], not cuda:1"


def test_the_pass_needs_two_gpus_and_the_report_says_why_it_did_not_run() -> None:
    assert skip_reason(2) is None and skip_reason(8) is None
    reason = skip_reason(1)
    assert reason == "skipped: FSDP needs 2 CUDA GPUs or more, this machine has 1"
    assert render_fsdp([], reason)[2] == reason
    table = render_fsdp([FsdpRow("lora", "ok", "d")], "")
    assert "| lora | ok | d |" in table
