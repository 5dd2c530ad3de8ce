"""Bad inputs to the GGUF steps get one-line errors and leave nothing looking finished; cancelling kills the child."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import psutil
import pytest

from desktop.services.local.common import LocalToolError, no_progress
from desktop.services.local.gguf import convert_lora_to_gguf, convert_to_gguf, fallback_report, quantize_gguf
from tests.fixtures.tiny_models import TinyModel


def _copy(model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model, tmp_path / "model"))


def _assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    left = out.parent.iterdir() if out.parent.is_dir() else iter(())
    assert not [p.name for p in left if p.name.startswith(f".{out.name}")]


def _one_line(error: pytest.ExceptionInfo[LocalToolError]) -> str:
    message = str(error.value)
    assert "\n" not in message
    assert "Traceback" not in message
    return message


async def test_corrupt_safetensors_is_named(gguf_tiny_model: Path, tmp_path: Path) -> None:
    model = _copy(gguf_tiny_model, tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "out" / "model.gguf"
    with pytest.raises(LocalToolError) as error:
        await convert_to_gguf(model, out, progress=no_progress)
    assert "corrupt or incomplete .safetensors" in _one_line(error)
    _assert_nothing_written(out)


async def test_unknown_architecture_is_named_with_what_still_works(gguf_tiny_model: Path, tmp_path: Path) -> None:
    model = _copy(gguf_tiny_model, tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"architectures": ["FooForCausalLM"]}))
    out = tmp_path / "model.gguf"
    with pytest.raises(LocalToolError) as error:
        await convert_to_gguf(model, out, progress=no_progress)
    message = _one_line(error)
    assert "cannot convert architecture FooForCausalLM" in message
    assert "merge and MLX still work" in message
    _assert_nothing_written(out)


async def test_unrecognised_tokenizer_says_what_still_works(tiny_model: TinyModel, tmp_path: Path) -> None:
    out = tmp_path / "model.gguf"
    with pytest.raises(LocalToolError) as error:
        await convert_to_gguf(tiny_model.path, out, progress=no_progress)
    message = _one_line(error)
    assert "does not recognise the tokenizer" in message
    assert "merge and MLX still work" in message
    _assert_nothing_written(out)


async def test_quantising_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    source = tmp_path / "model.safetensors"
    source.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    out = tmp_path / "model-q4.gguf"
    with pytest.raises(LocalToolError) as error:
        await quantize_gguf(source, out, "Q4_K_M", progress=no_progress)
    assert "is not a GGUF file" in _one_line(error)
    _assert_nothing_written(out)


async def test_unknown_quantisation_type(tmp_path: Path) -> None:
    with pytest.raises(LocalToolError) as error:
        await quantize_gguf(tmp_path / "x.gguf", tmp_path / "y.gguf", "Q3_XYZ", progress=no_progress)
    assert "Q4_K_M, Q5_K_M, Q6_K, Q8_0, F16" in _one_line(error)


async def test_lora_conversion_needs_an_adapter_folder(gguf_tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(LocalToolError) as error:
        await convert_lora_to_gguf(gguf_tiny_model, gguf_tiny_model, tmp_path / "lora.gguf", progress=no_progress)
    assert "no adapter_config.json" in _one_line(error)


def _converter_children() -> list[psutil.Process]:
    children = psutil.Process().children(recursive=True)
    return [c for c in children if any("convert_hf_to_gguf" in part for part in _cmdline(c))]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


async def test_cancelling_a_conversion_kills_the_converter(gguf_tiny_model: Path, tmp_path: Path) -> None:
    started = asyncio.Event()

    def progress(text: str, _fraction: float | None) -> None:
        if text.startswith("Loading model"):
            started.set()

    out = tmp_path / "model.gguf"
    task = asyncio.create_task(convert_to_gguf(gguf_tiny_model, out, progress=progress))
    await asyncio.wait_for(started.wait(), 60)
    assert _converter_children()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _converter_children()
    _assert_nothing_written(out)


def test_fallback_report_counts_weights_by_type() -> None:
    tensors = [
        ("blk.0.attn_q.weight", "Q5_0", 64, 2),
        ("blk.0.attn_v.weight", "Q8_0", 64, 2),
        ("blk.0.ffn_up.weight", "Q4_K", 256, 2),
        ("blk.0.ffn_down.weight", "Q6_K", 512, 2),
        ("blk.0.attn_norm.weight", "F32", 64, 1),
    ]
    # said in plain words: what happened, why, what it means for the file, and that nothing is to be done
    plain = (
        "their rows do not split into Q4_K_M's blocks of 256 values (usual for small models). The file is a "
        "little larger and no less exact; it works as it is, nothing to do"
    )
    assert fallback_report("Q4_K_M", tensors) == [
        f"1 of 4 weight tensors are stored as Q5_0 instead: {plain}",
        f"1 of 4 weight tensors are stored as Q8_0 instead: {plain}",
    ]
    # another type on rows that would split: llama.cpp's own choice, said without a made-up reason
    assert fallback_report("Q4_K_M", [("w", "Q8_0", 512, 2), ("v", "Q4_K", 512, 2)]) == [
        "1 of 2 weight tensors are stored as Q8_0, as llama.cpp chose for them; the file works as it is, nothing to do"
    ]
    assert fallback_report("Q8_0", [("w", "Q8_0", 64, 2), ("n", "F32", 64, 1)]) == []
