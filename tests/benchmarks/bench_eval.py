"""Evaluation speed: rows judged per second by rentune eval against the plain transformers + peft loop it runs.

The baseline is what any script would do for the same verdict: start Python, load the base with the adapter, and for
each held-out row generate greedily with the adapter off and on and score the reference with each. rentune's
evaluation adds the data check of the rows, its child Python (the comparison a rented machine runs too), the checks,
the verdict and the report.
SmolLM2-135M-Instruct with a pattern adapter trained for the benchmark, 20 rows, answers of up to 16 tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from desktop.services.evaluation.judge import JudgeOptions, judge_and_report
from tests.benchmarks.common import Row, print_table
from tests.fixtures.adapters import PATTERN, train_pattern_adapter, write_pattern_jsonl
from tests.fixtures.smollm2 import ensure_smollm2

ROWS = PATTERN * 5
MAX_NEW_TOKENS = 16
TARGET_RATIO = 0.9
RUNS = 3


_BASELINE = """
import contextlib, json, sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base, adapter, rows, max_new_tokens = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(base)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter).eval()
for question, answer in rows:
    prompt = [{"role": "user", "content": question}]
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt")
    prompt_ids = prompt_ids["input_ids"] if not isinstance(prompt_ids, torch.Tensor) else prompt_ids
    full = tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], return_tensors="pt")
    full = full["input_ids"] if not isinstance(full, torch.Tensor) else full
    for tuned in (False, True):
        with torch.inference_mode(), model.disable_adapter() if not tuned else contextlib.nullcontext():
            model.generate(input_ids=prompt_ids, max_new_tokens=max_new_tokens, do_sample=False)
            model(input_ids=full)
"""


def _baseline(base: Path, adapter: Path) -> float:
    """Seconds for the plain loop over every row as a script of its own (Python's start and load included, as in
    rentune's, whose models run in a child Python)."""
    start = time.perf_counter()
    command = [sys.executable, "-c", _BASELINE, str(base), str(adapter), json.dumps(ROWS), str(MAX_NEW_TOKENS)]
    subprocess.run(command, check=True, env=os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return time.perf_counter() - start


def _ours(base: Path, adapter: Path, eval_file: Path, out: Path) -> float:
    start = time.perf_counter()
    options = JudgeOptions(max_new_tokens=MAX_NEW_TOKENS)
    asyncio.run(judge_and_report(str(base), adapter, eval_file, out, options=options))
    return time.perf_counter() - start


def run() -> bool:
    smollm2 = ensure_smollm2()
    ours: list[float] = []
    baseline: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        adapter = train_pattern_adapter(smollm2.hf, work / "adapter", steps=12, learning_rate=3e-3)
        eval_file = write_pattern_jsonl(work / "eval.jsonl", ROWS)
        _baseline(smollm2.hf, adapter.path)  # warms the file cache and torch for both sides
        for run_number in range(RUNS):  # interleaved, so neither side has the warmer machine
            ours.append(_ours(smollm2.hf, adapter.path, eval_file, work / f"out-{run_number}"))
            baseline.append(_baseline(smollm2.hf, adapter.path))
    print(f"{len(ROWS)} held-out rows, base and tuned answers of up to {MAX_NEW_TOKENS} tokens and both losses")
    print(f"median of {RUNS} interleaved runs each (load included), after one warm-up run")
    rate, base_rate = len(ROWS) / statistics.median(ours), len(ROWS) / statistics.median(baseline)
    met = rate >= TARGET_RATIO * base_rate
    target = f">= {TARGET_RATIO}x plain loop"
    return print_table([Row("eval rows/s, SmolLM2 + LoRA", rate, base_rate, "r", target, met)])
