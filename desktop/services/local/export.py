"""``rentune export``'s engine: from an adapter and its base to every output asked for, checked before any work.

Order: read the base's config and tokenizer (a Hub model's small files only) and judge each asked-for output as the
converters would (llama.cpp's own converter on the tokenizer, the adapter against the base's sizes), refusing before
any download or merge; then fetch the base, compare every tensor shape, merge, convert, quantise, write the
Modelfile and the MLX folder.
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

from desktop.core.export.compatibility import Compatibility, OutputFormat, Toolchain, Verdict, config_problems
from desktop.services.local.base_model import base_description, local_base
from desktop.services.local.common import LocalInputError, LocalToolError, Progress, no_progress
from desktop.services.local.facts import adapter_facts, mlx_model_types, read_json
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


async def check_before_download(request: ExportRequest, description: Path, progress: Progress = no_progress) -> None:
    """What the converters would refuse, checked on the base's config and tokenizer before weights come or merge.

    The adapter against the base's sizes; for GGUF, llama.cpp's own converter on the config and tokenizer (its
    architecture, vocabulary type and pre-tokenizer); for MLX, whether mlx-lm knows the model type.

    Raises:
        LocalToolError: An asked-for output cannot be made, or the adapter is for another base; nothing is written.
    """
    verdicts = await judge_outputs(request.adapter, description, request.formats(), progress)
    for fmt in request.formats():
        if not verdicts[fmt].possible:
            raise LocalInputError(
                f"cannot write {fmt.value}: {verdicts[fmt].reason}; nothing was downloaded or written"
            )


async def judge_outputs(
    adapter: Path, description: Path, formats: list[OutputFormat] | None = None, progress: Progress = no_progress
) -> dict[OutputFormat, Verdict]:
    """Which outputs can be made from ``adapter`` over the base described by ``description`` (config, tokenizer).

    Only the formats in ``formats`` (all when None) are checked with their tools; the others are judged possible.
    """
    wanted = set(formats or OutputFormat)
    config = await asyncio.to_thread(read_json, description / "config.json", "the base model")
    facts = await asyncio.to_thread(adapter_facts, adapter)
    mismatch = config_problems(facts, config)
    if mismatch:
        more = f" (and {len(mismatch) - 1} more)" if len(mismatch) > 1 else ""
        reason = (
            f"the adapter was trained on another base model: {mismatch[0]}{more}; choose the base it was trained on"
        )
        return {fmt: Verdict(False, reason) for fmt in OutputFormat}
    verdicts = {fmt: Verdict(True) for fmt in OutputFormat}
    if wanted & {OutputFormat.GGUF, OutputFormat.LORA_GGUF, OutputFormat.OLLAMA}:
        gguf = await _gguf_verdict(description, progress)
        verdicts |= {OutputFormat.GGUF: gguf, OutputFormat.OLLAMA: gguf, OutputFormat.LORA_GGUF: gguf}
        if gguf.possible and (facts.modules_to_save or facts.use_dora):
            whole = ", ".join(facts.modules_to_save) or "DoRA magnitudes"
            verdicts[OutputFormat.LORA_GGUF] = Verdict(False, f"a GGUF LoRA cannot carry the adapter's {whole}")
    if OutputFormat.MLX in wanted:
        types, missing = mlx_model_types()
        model_type = str(config.get("model_type", ""))
        if types is None or model_type not in types:
            verdicts[OutputFormat.MLX] = Verdict(False, missing or f"mlx-lm cannot load model type {model_type!r}")
    return verdicts


async def _gguf_verdict(description: Path, progress: Progress) -> Verdict:
    from desktop.services.local.gguf import check_vocabulary

    try:
        await check_vocabulary(description, progress)
    except LocalToolError as exc:
        return Verdict(False, str(exc))
    return Verdict(True)


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
    description = await base_description(request.base, progress)
    await check_before_download(request, description, progress)
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
