"""The GPU check's serving pass, proven on the CPU with the backend a machine without vLLM takes (llama.cpp's).

On a GPU the same pass asks for vLLM; here the payload serves the taught adapter as llama-cpp-python's server, and
the pass must see it serve, count both requests, and end on Stop with nothing left answering on its port.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.fixtures.adapters import TrainedAdapter
from tests.gpu.serve_check import SERVED_NAME, ServeRow, render_serve, serve_adapter
from tests.payload.test_serve import _converters
from trainer_payload.protocol import ADAPTER_DIR_NAME

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


def test_the_pass_sees_the_adapter_served_counts_both_requests_and_ends_it_on_stop(
    gguf_pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(gguf_pattern_adapter.path, out / ADAPTER_DIR_NAME)
    job = tmp_path / "job.json"
    spec = {"base_model": str(gguf_pattern_adapter.base), "train_file": "t.jsonl", "output_dir": str(out), "lora_r": 8}
    job.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}

    row = serve_adapter(job, env, 240, backend="llama.cpp", extra={"converters": str(_converters())})

    assert row.status.startswith(f"ok: served '{SERVED_NAME}' with llama.cpp, counted both requests, ended on Stop")
    assert row.requests == 2 and row.ready_s is not None and row.tokens_per_s is not None and row.tokens_per_s > 0
    section = "\n".join(render_serve(row))
    assert "| requests counted |" in section and f"| {row.ready_s} s |" in section


def test_a_pass_that_never_ran_or_was_skipped_says_why() -> None:
    assert render_serve(None)[2] == "not run"
    assert render_serve(ServeRow("skipped (no CUDA)"))[2] == "skipped (no CUDA)"
