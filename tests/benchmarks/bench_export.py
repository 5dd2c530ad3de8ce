"""Export times for SmolLM2-135M-Instruct: merge, GGUF conversion and quantisation, against the bare library calls.

Each step runs through rentune's service (child process, checks, temporary names) and, side by side, the bare call
it wraps, each in a fresh Python as well (imports count on both sides): PEFT's merge_and_unload + save_pretrained,
convert_hf_to_gguf.py run by hand, and llama_cpp.llama_model_quantize. The ratio is the price of the checks.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from desktop.services.local.common import no_progress
from desktop.services.local.gguf import convert_to_gguf, quantize_gguf
from desktop.services.local.llama_cpp_source import llama_cpp_converters
from desktop.services.local.merge import merge_adapter
from tests.benchmarks.common import Row, print_table
from tests.fixtures.adapters import train_pattern_adapter
from tests.fixtures.smollm2 import ensure_smollm2

#: The merge also computes the logits twice and checks them; on a 135M model that fixed cost shows, on a 7B it fades.
TARGET_RATIO = 1.5


def _in_fresh_python(function: str, *args: Path) -> None:
    """Calls one of this module's bare functions in a new Python process."""
    code = f"import sys; from tests.benchmarks.bench_export import {function}; {function}(*sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True)


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _direct_merge(base: str, adapter: str, out: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    model.merge_and_unload().to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)


def _direct_convert(merged: Path, out: Path) -> None:
    converters = asyncio.run(llama_cpp_converters(no_progress))
    command = [sys.executable, str(converters.convert_hf), str(merged), "--outfile", str(out), "--outtype", "f16"]
    subprocess.run(command, env=converters.env(), check=True, capture_output=True)


def _direct_quantize(source: str, out: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params)) == 0


def _rows(work: Path) -> list[Row]:
    smol = ensure_smollm2()
    adapter = train_pattern_adapter(smol.hf, work / "adapter", steps=2).path
    ours = _seconds(lambda: asyncio.run(merge_adapter(smol.hf, adapter, work / "merged")))
    bare = _seconds(lambda: _in_fresh_python("_direct_merge", smol.hf, adapter, work / "merged-direct"))
    rows = [
        Row("merge, SmolLM2 (logits checked)", ours, bare, "s", f"<= {TARGET_RATIO}x bare", ours <= TARGET_RATIO * bare)
    ]
    f16 = work / "model-F16.gguf"
    ours = _seconds(lambda: asyncio.run(convert_to_gguf(work / "merged", f16, progress=no_progress)))
    bare = _seconds(lambda: _direct_convert(work / "merged", work / "direct-F16.gguf"))
    rows.append(Row("convert to GGUF F16", ours, bare, "s", f"<= {TARGET_RATIO}x bare", ours <= TARGET_RATIO * bare))
    q4 = work / "model-Q4_K_M.gguf"
    ours = _seconds(lambda: asyncio.run(quantize_gguf(f16, q4, "Q4_K_M", progress=no_progress)))
    bare = _seconds(lambda: _in_fresh_python("_direct_quantize", f16, work / "direct-Q4_K_M.gguf"))
    rows.append(Row("quantise to Q4_K_M", ours, bare, "s", f"<= {TARGET_RATIO}x bare", ours <= TARGET_RATIO * bare))
    return rows


def run() -> bool:
    with tempfile.TemporaryDirectory(prefix="rentune-bench-export-") as work:
        rows = _rows(Path(work))
    print(f"SmolLM2-135M-Instruct on {os.cpu_count()} cores; rentune's step against the bare library call")
    return print_table(rows)
