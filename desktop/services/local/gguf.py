"""GGUF outputs with llama.cpp's own tools: a model folder to GGUF, quantisation, a LoRA adapter to GGUF LoRA.

Every step runs in a child process (cancelling the awaiting task kills it) and writes under a temporary name that
is renamed only when the step succeeded, so nothing half-written looks finished.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from desktop.services.local import quantize_job
from desktop.services.local.common import (
    LocalToolError,
    Progress,
    finished_file,
    folder_bytes,
    no_progress,
    require_free_space,
)
from desktop.services.local.llama_cpp_source import Converters, convertible_architectures, llama_cpp_converters
from desktop.services.local.toolenv import job_file, run_python

#: The quantisation types offered, each a ``LLAMA_FTYPE_MOSTLY_<TYPE>`` of llama.cpp.
QUANT_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")
DEFAULT_QUANT = "Q4_K_M"

# The tensor types each file type writes for 2-D weights (K-quant mixes use Q6_K for some tensors), and the row
# width the main type needs; a 2-D tensor of another type is one llama.cpp fell back on.
_EXPECTED = {
    "Q4_K_M": ({"Q4_K", "Q6_K"}, 256),
    "Q5_K_M": ({"Q5_K", "Q6_K"}, 256),
    "Q6_K": ({"Q6_K"}, 256),
    "Q8_0": ({"Q8_0"}, 32),
    "F16": ({"F16"}, 1),
}
_WORKS_ANYWAY = "merge and MLX still work"


@dataclass(frozen=True)
class QuantizeResult:
    """A quantised GGUF file and what llama.cpp actually wrote.

    Attributes:
        path: The GGUF file.
        qtype: The type asked for (``"Q4_K_M"``).
        tensor_types: Number of tensors of each GGML type (``{"Q4_K": 12, "F32": 9}``).
        fallbacks: One line per type llama.cpp fell back on, in plain words: "12 of 14 weight tensors are stored as
            Q5_0 instead: their rows do not split into Q4_K_M's blocks of 256 values ..."; empty when every weight
            got the type asked for.
    """

    path: Path
    qtype: str
    tensor_types: dict[str, int]
    fallbacks: list[str]


def _weights_bytes(model_dir: Path) -> int:
    files = [*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")]
    return sum(f.stat().st_size for f in files)


def _architecture(model_dir: Path) -> str:
    config = model_dir / "config.json"
    try:
        architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError) as exc:
        raise LocalToolError(f"{config} cannot be read ({exc}); point to a Hugging Face model folder") from None
    if not architectures:
        raise LocalToolError(f'{config} names no architecture; add "architectures" or re-save the model')
    return str(architectures[0])


def check_safetensors(model_dir: Path) -> None:
    """Raises :class:`LocalToolError` if a ``.safetensors`` file in ``model_dir`` is truncated or not safetensors.

    Reads each file's header (its length, then JSON) and checks the tensors' data ends where the file ends.
    """
    for weights in sorted(model_dir.glob("*.safetensors")):
        if not _whole_safetensors(weights):
            raise LocalToolError(
                f"{weights} is a corrupt or incomplete .safetensors file; download or merge the model again"
            )


def _whole_safetensors(path: Path) -> bool:
    size = path.stat().st_size
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if size < 8 or length > size - 8:
            return False
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, ValueError):
            return False
    ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    return 8 + length + max(ends, default=0) == size


def check_convertible(model_dir: Path, converters: Converters) -> None:
    """Raises :class:`LocalToolError` unless the weights in ``model_dir`` are whole and llama.cpp knows its model."""
    check_safetensors(model_dir)
    architecture = _architecture(model_dir)
    if architecture not in convertible_architectures(converters):
        raise LocalToolError(
            f"llama.cpp {converters.version} cannot convert architecture {architecture} to GGUF; {_WORKS_ANYWAY}"
        )


#: The small files of a model that say what it is: config, tokenizer, chat template (no weights).
DESCRIPTION_FILES = ("*.json", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken")


async def check_vocabulary(model_dir: Path, progress: Progress) -> None:
    """Runs llama.cpp's own converter on the model's config and tokenizer alone (``--vocab-only``), no weights.

    The converter refuses here what it would refuse after a download and a merge: an architecture it does not
    register, a vocabulary type it cannot read, a BPE pre-tokenizer it does not know. Seconds, and nothing is kept.

    Raises:
        LocalToolError: The converter refuses the model; the message names why and what still works.
    """
    converters = await llama_cpp_converters(progress)
    architecture = _architecture(model_dir)
    if architecture not in convertible_architectures(converters):
        raise LocalToolError(
            f"llama.cpp {converters.version} cannot convert architecture {architecture} to GGUF; {_WORKS_ANYWAY}"
        )
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rentune-vocab-") as scratch:
        copying = asyncio.ensure_future(asyncio.to_thread(_copy_description, model_dir, Path(scratch) / "model"))
        try:
            described = await asyncio.shield(copying)
        except asyncio.CancelledError:
            # A thread cannot be stopped: let the copy end before its folder is removed, or the removal races it
            # and an OSError ("directory not empty") replaces the cancellation.
            await asyncio.wait([copying])
            raise
        args = [str(converters.convert_hf), str(described), "--vocab-only", "--outfile", str(Path(scratch) / "v.gguf")]
        progress("checking the tokenizer with llama.cpp's converter", None)
        try:
            await run_python(args, env=converters.env(), on_line=lines.append, what="convert_hf_to_gguf.py")
        except LocalToolError as exc:
            raise _conversion_error(lines, model_dir, exc) from None


def _copy_description(model_dir: Path, target: Path) -> Path:
    """Copies the model's config and tokenizer files (not its weights) into ``target``; returns ``target``."""
    target.mkdir()
    for pattern in DESCRIPTION_FILES:
        for file in model_dir.glob(pattern):
            shutil.copy2(file, target / file.name)
    return target


def _conversion_error(lines: list[str], model_dir: Path, error: LocalToolError) -> LocalToolError:
    """A one-line error for a failed conversion, naming the known causes."""
    text = "\n".join(lines)
    if "BPE pre-tokenizer was not recognized" in text:
        return LocalToolError(
            f"llama.cpp does not recognise the tokenizer of {model_dir} (its pre-tokenizer is not one llama.cpp "
            f"knows), so it cannot be converted to GGUF; {_WORKS_ANYWAY}"
        )
    for line in lines:
        if line.startswith("ERROR:") and "is not supported" in line:
            return LocalToolError(f"llama.cpp cannot convert {model_dir}: {line.split(':', 2)[-1]}; {_WORKS_ANYWAY}")
    if any(sign in text for sign in ("SafetensorError", "Error while deserializing", "mmap length is greater")):
        return LocalToolError(
            f"the weights in {model_dir} cannot be read (a corrupt or incomplete .safetensors file); "
            "download or merge the model again"
        )
    return error


def _step_reporter(progress: Progress, lines: list[str], prefix: str) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        lines.append(line)
        if line.startswith(f"INFO:{prefix}:") and not line.startswith(f"INFO:{prefix}:blk."):
            progress(line.split(":", 2)[2], None)

    return on_line


async def convert_to_gguf(model_dir: Path, out_file: Path, *, outtype: str = "f16", progress: Progress) -> Path:
    """Converts a Hugging Face model folder to one GGUF file with llama.cpp's ``convert_hf_to_gguf.py``.

    Args:
        model_dir: A model folder (``config.json``, safetensors weights, tokenizer, chat template).
        out_file: The GGUF file to write; it appears only when the conversion succeeded.
        outtype: The converter's ``--outtype``: ``f16`` (default), ``bf16``, ``f32``, ``q8_0`` or ``auto``.
        progress: Receives the converter's steps.

    Returns:
        ``out_file``.

    Raises:
        LocalToolError: The architecture or tokenizer is one llama.cpp cannot convert, the weights are unreadable,
            the disk is too full, or the converter failed; the message says which, in one line.
    """
    converters = await llama_cpp_converters(progress)
    check_convertible(model_dir, converters)
    require_free_space(out_file.parent, _weights_bytes(model_dir) * (2 if outtype == "f32" else 1), out_file.name)
    lines: list[str] = []
    with finished_file(out_file) as work:
        args = [str(converters.convert_hf), str(model_dir), "--outfile", str(work), "--outtype", outtype]
        progress(f"converting {model_dir.name} to GGUF ({outtype})", None)
        try:
            await run_python(
                args,
                env=converters.env(),
                on_line=_step_reporter(progress, lines, "hf-to-gguf"),
                what="convert_hf_to_gguf.py",
            )
        except LocalToolError as exc:
            raise _conversion_error(lines, model_dir, exc) from None
    return out_file


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False


def _require_gguf(source: Path, out_file: Path) -> None:
    if not _is_gguf(source):
        raise LocalToolError(f"{source} is not a GGUF file; convert the model to GGUF first")
    require_free_space(out_file.parent, source.stat().st_size, out_file.name)


def fallback_report(qtype: str, tensors: list[tuple[str, str, int, int]]) -> list[str]:
    """Lines saying which weight tensors did not get ``qtype``'s types, and why when the row width explains it.

    Args:
        qtype: The type asked for, one of :data:`QUANT_TYPES`.
        tensors: (name, GGML type, row width, dimensions) of each tensor written.
    """
    expected, row_multiple = _EXPECTED[qtype]
    weights = [t for t in tensors if t[3] >= 2]
    other = [t for t in weights if t[1] not in expected]
    lines = []
    for type_name, count in sorted(Counter(t[1] for t in other).items()):
        rows = [t[2] for t in other if t[1] == type_name]
        what = f"{count} of {len(weights)} weight tensors are stored as {type_name}"
        if all(r % row_multiple for r in rows):
            # llama.cpp's fallbacks for a K-quant (Q5_0, Q5_1, Q8_0) never hold fewer bits than the type asked for
            lines.append(
                f"{what} instead: their rows do not split into {qtype}'s blocks of {row_multiple} values (usual for "
                "small models). The file is a little larger and no less exact; it works as it is, nothing to do"
            )
        else:
            lines.append(f"{what}, as llama.cpp chose for them; the file works as it is, nothing to do")
    return lines


async def quantize_gguf(
    source: Path, out_file: Path, qtype: str = DEFAULT_QUANT, *, progress: Progress
) -> QuantizeResult:
    """Quantises a GGUF file with ``llama_cpp.llama_model_quantize`` (in a child process) and reports fallbacks.

    Args:
        source: A GGUF file, usually the F16 one :func:`convert_to_gguf` wrote.
        out_file: The GGUF file to write; it appears only when quantisation succeeded.
        qtype: One of :data:`QUANT_TYPES` (``F16`` re-writes every weight as 16-bit).
        progress: Receives the step.

    Raises:
        LocalToolError: ``source`` is not a GGUF file, ``qtype`` is unknown, the disk is too full, or llama.cpp
            failed; in one line.
    """
    qtype = qtype.upper()
    if qtype not in QUANT_TYPES:
        raise LocalToolError(f"unknown GGUF type {qtype}; choose one of {', '.join(QUANT_TYPES)}")
    _require_gguf(source, out_file)
    converters = await llama_cpp_converters(progress)
    with finished_file(out_file) as work:
        progress(f"quantising {source.name} to {qtype}", None)
        args = [str(job_file(quantize_job)), str(source), str(work), qtype]
        output = await run_python(args, env=converters.env(), what=f"quantising to {qtype}")
    tensors = _result_tensors(output)
    counts = dict(sorted(Counter(t[1] for t in tensors).items()))
    return QuantizeResult(out_file, qtype, counts, fallback_report(qtype, tensors))


async def fallbacks_of(path: Path, qtype: str, progress: Progress = no_progress) -> list[str]:
    """What :func:`quantize_gguf` reports for a GGUF quantised elsewhere (a rented machine): its fallbacks.

    Raises:
        LocalToolError: The file cannot be read as GGUF.
    """
    converters = await llama_cpp_converters(progress)
    output = await run_python(
        [str(job_file(quantize_job)), "--tensors", str(path)], env=converters.env(), what=f"reading {path.name}"
    )
    return fallback_report(qtype.upper(), _result_tensors(output))


def _result_tensors(output: str) -> list[tuple[str, str, int, int]]:
    for line in reversed(output.splitlines()):
        if line.startswith(quantize_job.RESULT_PREFIX):
            rows = json.loads(line[len(quantize_job.RESULT_PREFIX) :])["tensors"]
            return [(str(n), str(t), int(w), int(d)) for n, t, w, d in rows]
    raise LocalToolError("the quantisation job printed no result; see the log for its output")


async def convert_lora_to_gguf(adapter_dir: Path, base_dir: Path, out_file: Path, *, progress: Progress) -> Path:
    """Converts a PEFT LoRA adapter to a GGUF LoRA with llama.cpp's ``convert_lora_to_gguf.py``.

    Load it beside the base model's GGUF: ``llama_cpp.Llama(model_path=BASE_GGUF, lora_path=out_file)``.

    Args:
        adapter_dir: The PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``).
        base_dir: The base model's Hugging Face folder (its config and tokenizer are read, not its weights).
        out_file: The GGUF LoRA to write; it appears only when the conversion succeeded.
        progress: Receives the converter's steps.

    Raises:
        LocalToolError: The base's architecture is one llama.cpp cannot convert, the adapter is unreadable, the
            disk is too full, or the converter failed; in one line.
    """
    if not (adapter_dir / "adapter_config.json").is_file():
        raise LocalToolError(f"{adapter_dir} has no adapter_config.json; point to a PEFT LoRA adapter folder")
    converters = await llama_cpp_converters(progress)
    check_convertible(base_dir, converters)
    require_free_space(out_file.parent, folder_bytes(adapter_dir), out_file.name)
    lines: list[str] = []
    with finished_file(out_file) as work:
        args = [str(converters.convert_lora), str(adapter_dir), "--base", str(base_dir), "--outfile", str(work)]
        progress(f"converting the adapter {adapter_dir.name} to a GGUF LoRA", None)
        try:
            await run_python(
                args,
                env=converters.env(),
                on_line=_step_reporter(progress, lines, "lora-to-gguf"),
                what="convert_lora_to_gguf.py",
            )
        except LocalToolError as exc:
            raise _conversion_error(lines, adapter_dir, exc) from None
    return out_file
