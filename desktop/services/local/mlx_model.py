"""An MLX model folder from a merged Hugging Face folder, and a check that mlx-lm generates with it.

mlx-lm loads a merged safetensors folder directly, with one pitfall: transformers 5 writes
``rope_parameters: {rope_theta: ...}`` and no top-level ``rope_theta``, so mlx-lm falls back to its default theta
and its greedy output drifts from the trained model's. The folder written here has the top-level keys mlx-lm reads.

mlx and mlx_lm are imported only in the child process that checks the folder.
"""

from __future__ import annotations

import asyncio
import json
import shutil
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
from desktop.services.local.toolenv import run_python

#: The one line shown wherever MLX is asked for but cannot be imported.
MLX_MISSING = "MLX needs Apple Silicon with the local tools installed (Models page, or rentune tools install)"

_MLX_MISSING_MARK = "RENTUNE-MLX-MISSING"
_ANSWER_MARK = "RENTUNE-ANSWER:"

#: Weights in formats mlx-lm does not read; everything else at the folder's top level is copied.
_SKIPPED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")

_GENERATE = f"""
import json, sys
try:
    import mlx.core
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler
except (ImportError, OSError):
    print({_MLX_MISSING_MARK!r}, flush=True)
    sys.exit(3)
model, tokenizer = load(sys.argv[1])
messages = [{{"role": "user", "content": sys.argv[2]}}]
prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
greedy = make_sampler(0.0)
parts = [r.text for r in stream_generate(model, tokenizer, prompt, max_tokens=int(sys.argv[3]), sampler=greedy)]
print({_ANSWER_MARK!r} + json.dumps("".join(parts)), flush=True)
"""


def mlx_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the top-level RoPE keys mlx-lm reads, taken from transformers 5's ``rope_parameters``.

    Args:
        config: A model's ``config.json`` as a dict (not changed).

    Returns:
        A copy with ``rope_theta`` (and ``rope_scaling`` for a non-default RoPE type) at the top level.
    """
    fixed = dict(config)
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict):
        return fixed
    if "rope_theta" not in fixed and "rope_theta" in rope:
        fixed["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default" and not fixed.get("rope_scaling"):
        fixed["rope_scaling"] = {key: value for key, value in rope.items() if key != "rope_theta"}
    return fixed


def _check_merged(merged_dir: Path) -> None:
    if not (merged_dir / "config.json").is_file():
        raise LocalToolError(f"{merged_dir} has no config.json; pass a merged model folder (rentune export --merge)")
    if not any(merged_dir.glob("*.safetensors")):
        raise LocalToolError(
            f"{merged_dir} has no .safetensors weights; MLX reads only safetensors: merge again with rentune export"
        )


def _copy_for_mlx(merged_dir: Path, work: Path) -> None:
    for source in sorted(merged_dir.iterdir()):
        if source.is_file() and source.name != "config.json" and not source.name.endswith(_SKIPPED_SUFFIXES):
            shutil.copy2(source, work / source.name)
    config = json.loads((merged_dir / "config.json").read_text(encoding="utf-8"))
    (work / "config.json").write_text(json.dumps(mlx_config(config), indent=2) + "\n", encoding="utf-8")


async def write_mlx_model(merged_dir: Path, out_dir: Path, progress: Progress = no_progress) -> Path:
    """Writes an MLX-loadable model folder from a merged Hugging Face folder.

    The weights, tokenizer and chat template are copied; config.json gets the top-level RoPE keys mlx-lm needs.
    The folder appears at ``out_dir`` only when complete.

    Args:
        merged_dir: A merged safetensors folder (weights, config, tokenizer, chat template).
        out_dir: The MLX folder to write (replaced at the end if it exists).
        progress: Told when the copy starts and ends.

    Returns:
        ``out_dir``.

    Raises:
        LocalToolError: ``merged_dir`` is not a safetensors model folder, or the disk is too full.
    """
    _check_merged(merged_dir)
    require_free_space(out_dir.parent, folder_bytes(merged_dir), "the MLX model")
    progress("writing the MLX model", 0.0)
    with finished_folder(out_dir) as work:
        await asyncio.to_thread(_copy_for_mlx, merged_dir, work)
    progress("writing the MLX model", 1.0)
    return out_dir


async def check_mlx_generates(folder: Path, prompt: str, max_tokens: int = 32) -> str:
    """Loads ``folder`` with mlx-lm in a child process and answers ``prompt`` greedily with its chat template.

    Args:
        folder: An MLX model folder (see :func:`write_mlx_model`).
        prompt: One user message.
        max_tokens: Longest answer in tokens.

    Returns:
        The answer's text.

    Raises:
        LocalToolError: MLX is not installed here, or mlx-lm could not load the folder or generate.
    """
    try:
        output = await run_python(
            ["-c", _GENERATE, str(folder), prompt, str(max_tokens)], what=f"generating with the MLX model {folder}"
        )
    except LocalToolError as exc:
        if _MLX_MISSING_MARK in str(exc):
            raise LocalToolError(MLX_MISSING) from exc
        raise
    answers = [line for line in output.splitlines() if line.startswith(_ANSWER_MARK)]
    if not answers:
        raise LocalToolError(f"the MLX check of {folder} printed no answer; its output: {output[-300:]!r}")
    answer: str = json.loads(answers[-1].removeprefix(_ANSWER_MARK))
    return answer
