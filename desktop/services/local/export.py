"""``rentune export``'s engine: from an adapter and its base to every output asked for, checked before any work.

Order: find the base, read both, judge each asked-for output (:mod:`desktop.core.export.compatibility`) and refuse
before any work when one cannot be made; then merge, convert, quantise, write the Modelfile and the MLX folder.
Each output is written under a temporary name and renamed when complete; intermediates that were not asked for
(the merged folder, the F16 GGUF) are removed at the end.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.core.export.compatibility import Compatibility, OutputFormat, Toolchain
from desktop.services.local.base_model import local_base
from desktop.services.local.common import LocalInputError, Progress, no_progress
from desktop.services.local.facts import mlx_model_types
from desktop.services.local.fit import ensure_fits
from desktop.services.local.merge import MergeResult, merge_adapter

#: What ``rentune export`` writes when no output is named.
DEFAULT_GGUF = "Q4_K_M"
#: The base GGUF's type beside a GGUF LoRA when no quantisation was asked for.
DEFAULT_BASE_GGUF = "Q8_0"
MLX_CHECK_PROMPT = "Say hello."


@dataclass(frozen=True)
class ExportRequest:
    """What to export.

    Attributes:
        adapter: The PEFT adapter folder.
        base: The base model: a folder, a Hub id, or None when the adapter's config must say.
        out: The folder to write into.
        merged: Write the merged 16-bit model.
        gguf: Quantisation types of the merged GGUF (``Q4_K_M``...), in the order asked.
        lora_gguf: Write the adapter as a GGUF LoRA, with the base as GGUF beside it.
        ollama: Write an Ollama ``Modelfile``.
        mlx: Write an MLX folder and check that it generates.
        base_gguf: Also write the base model as GGUF (``base-TYPE.gguf``), to chat with it beside the fine-tune.
    """

    adapter: Path
    base: str | None
    out: Path
    merged: bool = False
    gguf: tuple[str, ...] = ()
    lora_gguf: bool = False
    ollama: bool = False
    mlx: bool = False
    base_gguf: bool = False

    def formats(self) -> list[OutputFormat]:
        """The output formats asked for."""
        asked = {
            OutputFormat.MERGED: self.merged,
            OutputFormat.GGUF: bool(self.gguf) or self.base_gguf,
            OutputFormat.LORA_GGUF: self.lora_gguf,
            OutputFormat.OLLAMA: self.ollama,
            OutputFormat.MLX: self.mlx,
        }
        return [fmt for fmt, wanted in asked.items() if wanted]


@dataclass
class ExportResult:
    """What was written (None or empty for what was not asked for), and what the user should know about it.

    Attributes:
        merged: The merged model folder.
        gguf: Quantisation type to GGUF file.
        lora_gguf: The GGUF LoRA.
        base_gguf: The base model's GGUF beside the LoRA.
        modelfile: The Ollama Modelfile.
        mlx: The MLX model folder.
        merge_check: How closely the merge matched base + adapter.
        mlx_sample: What the MLX model answered to the check prompt.
        notes: Things to know (tensors that fell back to another type...).
    """

    merged: Path | None = None
    gguf: dict[str, Path] = field(default_factory=dict)
    lora_gguf: Path | None = None
    base_gguf: Path | None = None
    modelfile: Path | None = None
    mlx: Path | None = None
    merge_check: MergeResult | None = None
    mlx_sample: str | None = None
    notes: list[str] = field(default_factory=list)


def with_defaults(request: ExportRequest) -> ExportRequest:
    """``request``, or when it names no output: merged, GGUF Q4_K_M with its Modelfile, and MLX where it runs."""
    if request.formats():
        return request
    mlx_here = mlx_model_types()[0] is not None
    return ExportRequest(request.adapter, request.base, request.out, True, (DEFAULT_GGUF,), False, True, mlx_here)


async def check_export(request: ExportRequest, base: Path, progress: Progress = no_progress) -> Compatibility:
    """Judges the adapter against the base for each output, fetching llama.cpp's converters when GGUF is asked for.

    Raises:
        LocalToolError: The adapter does not fit the base, or an asked-for output cannot be made (the message says
            which, and why).
    """
    tools = await _toolchain(request, progress)
    compatibility = await asyncio.to_thread(ensure_fits, request.adapter, base, tools)
    for fmt in request.formats():
        verdict = compatibility.verdicts[fmt]
        if not verdict.possible:
            raise LocalInputError(f"cannot write {fmt.value}: {verdict.reason}; nothing was written")
    return compatibility


async def _toolchain(request: ExportRequest, progress: Progress) -> Toolchain:
    gguf: frozenset[str] | None = None
    gguf_missing = "not asked for"
    if request.gguf or request.lora_gguf or request.ollama:
        from desktop.services.local.llama_cpp_source import convertible_architectures, llama_cpp_converters

        gguf = convertible_architectures(await llama_cpp_converters(progress))
    mlx, mlx_missing = mlx_model_types() if request.mlx else (None, "not asked for")
    return Toolchain(gguf, gguf_missing, mlx, mlx_missing)


async def export(request: ExportRequest, progress: Progress = no_progress) -> ExportResult:
    """Writes every output ``request`` asks for into ``request.out``.

    Raises:
        LocalToolError: Any step failed; outputs finished before it stay, nothing half-written is left.
    """
    base = await local_base(request.base, progress)
    await check_export(request, base, progress)
    await asyncio.to_thread(request.out.mkdir, parents=True, exist_ok=True)
    result = ExportResult()
    scratch = request.out / ".work"
    try:
        await _write_outputs(request, base, scratch, result, progress)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)
    return result


async def _write_outputs(
    request: ExportRequest, base: Path, scratch: Path, result: ExportResult, progress: Progress
) -> None:
    merged: Path | None = None
    if request.merged or request.gguf or request.ollama or request.mlx:
        target = request.out / "merged" if request.merged else scratch / "merged"
        result.merge_check = await merge_adapter(base, request.adapter, target, progress)
        merged = target
        result.merged = target if request.merged else None
    steps: list[Callable[[], Coroutine[Any, Any, None]]] = []
    if merged is not None and (request.gguf or request.ollama):
        steps.append(lambda: _write_gguf(request, merged, scratch, result, progress))
    if request.lora_gguf:
        steps.append(lambda: _write_lora_gguf(request, base, scratch, result, progress))
    elif request.base_gguf:
        steps.append(lambda: _write_base_gguf(request, base, scratch, result, progress))
    if request.ollama:
        steps.append(lambda: _write_modelfile(request, merged or base, result))
    if request.mlx and merged is not None:
        steps.append(lambda: _write_mlx(request, merged, result, progress))
    for step in steps:
        await step()


async def _write_gguf(
    request: ExportRequest, merged: Path, scratch: Path, result: ExportResult, progress: Progress
) -> None:
    from desktop.services.local.gguf import convert_to_gguf, quantize_gguf

    types = request.gguf or (DEFAULT_GGUF,)
    f16 = request.out / "model-F16.gguf" if "F16" in types else scratch / "model-F16.gguf"
    await convert_to_gguf(merged, f16, outtype="f16", progress=progress)
    for qtype in types:
        if qtype == "F16":
            result.gguf[qtype] = f16
            continue
        quantized = await quantize_gguf(f16, request.out / f"model-{qtype}.gguf", qtype, progress=progress)
        result.gguf[qtype] = quantized.path
        result.notes += [f"{qtype}: {line}" for line in quantized.fallbacks]


async def _write_lora_gguf(
    request: ExportRequest, base: Path, scratch: Path, result: ExportResult, progress: Progress
) -> None:
    from desktop.services.local.gguf import convert_lora_to_gguf

    result.lora_gguf = await convert_lora_to_gguf(
        request.adapter, base, request.out / "adapter-lora.gguf", progress=progress
    )
    await _write_base_gguf(request, base, scratch, result, progress)


async def _write_base_gguf(
    request: ExportRequest, base: Path, scratch: Path, result: ExportResult, progress: Progress
) -> None:
    """The base model as GGUF of the first type asked for (Q8_0 when none), beside the fine-tune's files."""
    from desktop.services.local.gguf import convert_to_gguf, quantize_gguf

    progress("converting the base model to GGUF, to compare with", None)
    base_type = request.gguf[0] if request.gguf else DEFAULT_BASE_GGUF
    f16 = request.out / "base-F16.gguf" if base_type == "F16" else scratch / "base-F16.gguf"
    await convert_to_gguf(base, f16, outtype="f16", progress=progress)
    if base_type == "F16":
        result.base_gguf = f16
        return
    quantized = await quantize_gguf(f16, request.out / f"base-{base_type}.gguf", base_type, progress=progress)
    result.base_gguf = quantized.path


async def _write_modelfile(request: ExportRequest, tokenizer: Path, result: ExportResult) -> None:
    from desktop.services.local.modelfile import write_modelfile

    if result.gguf:
        model, adapter = next(iter(result.gguf.values())), None
    elif result.base_gguf is not None:
        model, adapter = result.base_gguf, result.lora_gguf
    else:
        raise LocalInputError("an Ollama Modelfile needs a GGUF: add --gguf TYPE or --lora-gguf")
    result.modelfile = await write_modelfile(model, tokenizer, request.out / "Modelfile", adapter_gguf=adapter)


async def _write_mlx(request: ExportRequest, merged: Path, result: ExportResult, progress: Progress) -> None:
    from desktop.services.local.mlx_model import check_mlx_generates, write_mlx_model

    result.mlx = await write_mlx_model(merged, request.out / "mlx", progress=progress)
    progress("checking that the MLX model generates", None)
    result.mlx_sample = await check_mlx_generates(result.mlx, MLX_CHECK_PROMPT, max_tokens=16)
