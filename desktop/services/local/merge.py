"""Merging a LoRA adapter into its base: a 16-bit safetensors folder with the tokenizer and chat template.

The merge runs in a child Python (:mod:`trainer_payload.merge`, the same merge a rented machine runs after training),
so torch's memory leaves with it and a cancel stops it at once. Before saving, the merged model's logits on a probe
prompt are compared with the unmerged base + adapter; a merge that does not match is never written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.services.local.common import (
    LocalToolError,
    Progress,
    finished_folder,
    folder_bytes,
    no_progress,
    require_free_space,
)
from desktop.services.local.facts import base_weight_files, read_json
from desktop.services.local.toolenv import run_python

#: A float32 merge needs about twice a 16-bit model's bytes in memory; above this share of RAM, merge in 16 bits.
_FLOAT32_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class MergeResult:
    """A merged model and how closely it matches base + adapter.

    Attributes:
        folder: The merged model folder.
        dtype: The saved weights' type (``bfloat16`` or ``float16``).
        merged_in: The type the merge was computed in (``float32`` unless memory was short).
        max_difference: Largest |merged - unmerged| logit on the probe prompt.
        tolerance: The largest difference accepted.
        top1_agreement: Share of probe positions whose most likely next token is the same.
    """

    folder: Path
    dtype: str
    merged_in: str
    max_difference: float
    tolerance: float
    top1_agreement: float


def _stored_dtype(base: Path) -> str:
    config = read_json(base / "config.json", "the base model")
    value = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(value)


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return None


def _merge_in_half(weights: int, stored: str) -> bool:
    """Whether to merge in the stored 16-bit type: a float32 copy of the model would crowd this computer's memory."""
    if stored not in ("float16", "bfloat16"):
        return False
    memory = _memory_bytes()
    return memory is None or weights * 2 > memory * _FLOAT32_MEMORY_SHARE


async def merge_adapter(base: Path, adapter: Path, out: Path, progress: Progress = no_progress) -> MergeResult:
    """Merges ``adapter`` into ``base`` and writes the 16-bit result to ``out`` (replacing it only when done).

    Raises:
        LocalToolError: The merge failed, the logits did not match, or the disk is too small.
    """
    weights = sum(file.stat().st_size for file in base_weight_files(base))
    stored = _stored_dtype(base)
    saved_bytes = weights if stored in ("float16", "bfloat16") else weights // 2
    require_free_space(out.parent, saved_bytes + folder_bytes(adapter), "the merged model")
    job = {"base": str(base), "adapter": str(adapter), "stored_dtype": stored, "half": _merge_in_half(weights, stored)}
    with finished_folder(out) as work:
        job["out"] = str(work)
        result = await _run_merge(job, progress)
    return _result(out, result)


async def _run_merge(job: dict[str, Any], progress: Progress) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def on_line(line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "progress":
            fraction, _, text = rest.partition(" ")
            progress(f"merging: {text}", float(fraction))
        elif kind == "result":
            result.update(json.loads(rest))

    env = os.environ | {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    await run_python(["-m", "trainer_payload.merge", json.dumps(job)], env=env, on_line=on_line, what="the merge")
    if not result:
        raise LocalToolError("the merge ended without a result; see the log for its output")
    check = result["check"]
    if not check["ok"]:
        raise LocalToolError(
            f"the merged model does not match base + adapter (largest logit difference {check['max_difference']:.3g}, "
            f"allowed {check['tolerance']:.3g}); nothing was written. Please report this with the adapter's "
            "adapter_config.json"
        )
    return result


def _result(out: Path, result: dict[str, Any]) -> MergeResult:
    check = result["check"]
    return MergeResult(
        out,
        result["dtype"],
        check["merged_in"],
        check["max_difference"],
        check["tolerance"],
        check["top1_agreement"],
    )
