"""Data check: throughput and peak memory on a generated 200 MB JSONL file; token counting against batch-encode.

- ``rentune data check`` (no tokenizer) in a child process: MB/s and peak RSS, beside a bare
  ``for line in file: json.loads(line)`` loop over the same file.
- Exact token counting (chat template + fast tokenizer) against the tokenizer's own batch-encode of the same,
  already rendered texts, on the tiny test model's tokenizer.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
import time
from pathlib import Path

from tests.benchmarks.common import PYTHON, Row, print_table

TARGET_BYTES = 200 * 1024 * 1024
PROSE = (
    "the model learns from each example and the adapter keeps only a small low rank update so memory stays low "
    "while gradient checkpointing trades compute for activations and the loss falls steadily"
)
WORDS = PROSE.split()

CHECK = """
import resource, sys, time
from pathlib import Path
from desktop.services.data.check import check_dataset
start = time.perf_counter()
outcome = check_dataset(Path(sys.argv[1]))
elapsed = time.perf_counter() - start
print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, outcome.report.rows, flush=True)
"""
BARE = """
import json, resource, sys, time
start = time.perf_counter()
with open(sys.argv[1], "rb") as handle:
    for line in handle:
        json.loads(line)
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""


def generate(path: Path) -> int:
    rng = random.Random(0)
    written = 0
    with path.open("w", encoding="utf-8") as handle:
        index = 0
        while written < TARGET_BYTES:
            index += 1
            user = " ".join(rng.choices(WORDS, k=rng.randint(10, 80)))
            answer = " ".join(rng.choices(WORDS, k=rng.randint(40, 200)))
            line = (
                json.dumps(
                    {
                        "messages": [
                            {"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": f"{index}: {user}?"},
                            {"role": "assistant", "content": answer},
                        ]
                    }
                )
                + "\n"
            )
            handle.write(line)
            written += len(line)
    return written


def run_child(script: str, path: Path) -> tuple[float, float]:
    """Runs a script in a fresh process; returns (seconds, peak RSS in MB) as that process reports them."""
    out = subprocess.run([PYTHON, "-c", script, str(path)], capture_output=True, text=True, check=True).stdout
    seconds, peak_kb = out.split()[:2]
    return float(seconds), int(peak_kb) / 1024


def token_counting(rows: list[list[dict[str, str]]]) -> tuple[float, float]:
    from transformers import AutoTokenizer

    from desktop.services.data.tokens import ChatTemplateTokenCounter
    from tests.fixtures.tiny_models import build_tiny_model

    with tempfile.TemporaryDirectory() as folder:
        model = build_tiny_model(Path(folder) / "tiny", "llama")
        tokenizer = AutoTokenizer.from_pretrained(model.path)
    counter = ChatTemplateTokenCounter(tokenizer, "tiny")
    texts = tokenizer.apply_chat_template(rows, tokenize=False)
    start = time.perf_counter()
    for offset in range(0, len(rows), 512):
        counter.count(rows[offset : offset + 512])
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for offset in range(0, len(texts), 512):
        tokenizer(texts[offset : offset + 512], add_special_tokens=False, return_attention_mask=False)
    return ours, time.perf_counter() - start


def run() -> bool:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.jsonl"
        size = generate(path)
        check_s, check_mb = run_child(CHECK, path)
        bare_s, _ = run_child(BARE, path)
        with path.open(encoding="utf-8") as handle:
            sample = [json.loads(next(handle))["messages"] for _ in range(20_000)]
    ours, batch_encode = token_counting(sample)
    mb = size / 1e6
    print(
        f"file: {mb:,.0f} MB; check {check_s:.1f} s, bare json.loads loop {bare_s:.1f} s; "
        f"token counting of 20,000 rows {ours:.2f} s vs batch-encode {batch_encode:.2f} s"
    )
    return print_table(
        [
            Row("data check throughput (MB/s)", mb / check_s, mb / bare_s, "MB/s", ">= 50 MB/s", mb / check_s >= 50),
            Row("data check peak memory (MB)", check_mb, None, "MB", "< 300 MB", check_mb < 300),
            Row(
                "token counting time / batch-encode time",
                ours / batch_encode,
                None,
                "x",
                "<= 2x",
                ours / batch_encode <= 2,
            ),
        ]
    )
