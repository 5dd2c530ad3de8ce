"""``make gpu-check``'s FSDP pass: rank-0 loading and sharding on two GPUs, what the CPU tests cannot show.

It needs two CUDA GPUs or more; with fewer it says so and runs nothing. On two GPUs the load probe
(``tests/payload/fsdp_load_probe.py``) runs under ``accelerate launch`` with the payload's launch options for a LoRA
and a QLoRA job, then lets accelerate shard each model as training does and gathers it whole again:

- LoRA: rank 0 alone opened the weights, rank 1's parameters were all on the meta device, and after sharding every
  rank holds rank 0's weights byte for byte (FSDP's ``sync_module_states`` filled the empty rank);
- QLoRA: each rank loaded its own 4-bit weights onto its own GPU (``cuda:<rank>``, no ``device_map``), stored in the
  compute dtype, and sharding leaves both ranks with rank 0's bytes.

The payload itself then trains a LoRA job under FSDP on two GPUs to its ``done`` event (a row of the training table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fixtures.chat_data import write_chat_dataset
from tests.payload.fsdp_load_probe import launch, rank_reports, write_fsdp_job

FSDP_GPUS = 2


@dataclass
class FsdpRow:
    """One job of the FSDP pass: what each rank did, and the verdict (``ok: ...``, ``failed: ...``, ``skipped...``)."""

    job: str
    status: str
    detail: str = ""


def cuda_count() -> int:
    """CUDA GPUs this process sees."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def skip_reason(gpus: int) -> str | None:
    """Why the pass cannot run here (fewer than two GPUs), or None."""
    if gpus >= FSDP_GPUS:
        return None
    return f"skipped: FSDP needs {FSDP_GPUS} CUDA GPUs or more, this machine has {gpus}"


def _sharded_like_rank_zero(reports: list[dict[str, Any]]) -> str | None:
    """Why the ranks' gathered weights are not rank 0's loaded ones, or None."""
    loaded = reports[0].get("sharded", {}).get("before")
    if not loaded:
        return "rank 0 reported no weights before sharding"
    for report in reports:
        gathered = report.get("sharded", {}).get("after", {})
        if gathered != loaded:
            differ = sorted(set(loaded) ^ set(gathered)) or [n for n in loaded if loaded[n] != gathered[n]]
            return f"rank {report['rank']} after sharding differs from rank 0's weights ({len(differ)}: {differ[:3]})"
    return None


def judge_lora(reports: list[dict[str, Any]]) -> FsdpRow:
    """Rank 0 alone read the weights, the others started empty, and sharding gave every rank rank 0's weights."""
    head, others = reports[0], reports[1:]
    if not head["opened"] or not head.get("equal_to_file"):
        return FsdpRow("lora", "failed: rank 0 did not load the weights from the file", str(head["opened"]))
    readers = [r["rank"] for r in others if r["opened"]]
    if readers:
        return FsdpRow("lora", f"failed: ranks {readers} opened the weights file", str(others[0]["opened"]))
    loaded = [r["rank"] for r in others if {p["device"] for p in r["params"].values()} != {"meta"}]
    if loaded:
        return FsdpRow("lora", f"failed: ranks {loaded} hold weights before sharding (not empty)")
    problem = _sharded_like_rank_zero(reports)
    if problem:
        return FsdpRow("lora", f"failed: {problem}")
    count = len(head["sharded"]["after"])
    return FsdpRow("lora", "ok", f"rank 0 read the file alone; after sharding {count} tensors equal on every rank")


def judge_qlora(reports: list[dict[str, Any]]) -> FsdpRow:
    """Each rank quantised its own weights on its own GPU, stored in the compute dtype; sharding agrees with rank 0."""
    for report in reports:
        rank, params = report["rank"], report["params"]
        packed = [p for p in params.values() if p["kind"] == "Params4bit"]
        compute = {p["dtype"] for p in params.values() if p["kind"] != "Params4bit"}
        devices = {p["device"] for p in params.values()}
        stored = sorted({p["dtype"] for p in packed})
        if not packed or set(stored) != compute or len(compute) != 1:
            return FsdpRow("qlora", f"failed: rank {rank} stores its 4-bit weights as {stored}, computes in {compute}")
        if devices != {f"cuda:{rank}"}:
            return FsdpRow("qlora", f"failed: rank {rank}'s weights are on {sorted(devices)}, not cuda:{rank}")
    problem = _sharded_like_rank_zero(reports)
    if problem:
        return FsdpRow("qlora", f"failed: {problem}")
    dtype = next(p["dtype"] for p in reports[0]["params"].values() if p["kind"] == "Params4bit")
    return FsdpRow("qlora", "ok", f"each rank quantised on its own GPU, 4-bit weights stored as {dtype}")


def probe_rows(folder: Path, model_dir: Path, env: dict[str, str], timeout: float) -> list[FsdpRow]:
    """Runs the load probe on two GPUs for a LoRA and a QLoRA job and judges each."""
    folder.mkdir(parents=True, exist_ok=True)
    write_chat_dataset(folder / "train.jsonl", count=16)
    jobs = [write_fsdp_job(folder, method, model_dir, method=method) for method in ("lora", "qlora")]
    result = launch(jobs, folder, env, timeout)
    if result.returncode != 0:
        tail = " ".join((result.stdout + result.stderr)[-600:].split())
        return [FsdpRow("load probe", f"failed: exit {result.returncode}", tail)]
    return [judge_lora(rank_reports(folder, jobs[0])), judge_qlora(rank_reports(folder, jobs[1]))]


def render_fsdp(rows: list[FsdpRow], note: str) -> list[str]:
    """The FSDP section of the report."""
    lines = [f"## FSDP on {FSDP_GPUS} GPUs: rank 0 alone reads the weights, the other ranks start empty", ""]
    if not rows:
        return [*lines, note or "not run", ""]
    lines += ["| job | status | detail |", "|---|---|---|"]
    lines += [f"| {row.job} | {row.status} | {row.detail} |" for row in rows]
    return [*lines, ""]
