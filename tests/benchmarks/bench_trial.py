"""The trial on the CPU: tokens/s of the payload and of train_with_mlx against `mlx_lm lora` on the same slice.

Both train the tests' tiny Llama (hidden 64, 2 layers: MLX's CPU backend is slow, and a small step shows the
trial's per-step cost the most) with LoRA on the same rows, steps, rank, batch and sequence length: the bare run
reads the very configuration file train_with_mlx wrote (only its adapter folder differs), so the two differ by what
the trial adds (the reporting callback, reading the output line by line, the PEFT conversion). Six rounds of one
run each, the order alternating; the median of the six per-round ratios is compared (on a shared 2-core machine
the best run of either side swung by a fifth from one bench to the next). A run's tokens/s is the median of
mlx-lm's per-step tokens/s after the first step (which compiles); the bare run's come from the lines mlx-lm prints
(rounded to a whole token/s: small against the hundreds measured).
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from desktop.services.trial.mlx_trainer import CONFIG_FILE, train_with_mlx
from desktop.services.trial.payload_trainer import train_with_payload
from tests.benchmarks.common import Row, print_table
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import build_tiny_model

STEPS = 60
ROUNDS = 6
SEQ_LEN, RANK, LEARNING_RATE, BATCH_SIZE = 128, 8, 0.003, 4
TARGET = 0.95

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# mlx-lm 0.32's report line: "  12    5.781 ▼      1,234    4.5k" (step, loss, tokens/s, tokens so far).
_REPORT = re.compile(r"^\s*(\d+)\s+(\d+\.\d+)\s+[▼▲]\s+([\d,]+)\s+")


def run_ours(model: Path, data: Path, out: Path) -> tuple[float, float]:
    """Tokens/s and wall seconds of one trial through train_with_mlx."""
    start = time.perf_counter()
    training = asyncio.run(
        train_with_mlx(
            sys.executable,
            model,
            data,
            out,
            steps=STEPS,
            seq_len=SEQ_LEN,
            rank=RANK,
            learning_rate=LEARNING_RATE,
            batch_size=BATCH_SIZE,
        )
    )
    seconds = time.perf_counter() - start
    return statistics.median(s.tokens_per_s or 0.0 for s in training.steps[1:]), seconds


def run_bare(config: Path, out: Path) -> tuple[float, float]:
    """Tokens/s and wall seconds of `python -m mlx_lm lora` with the trial's configuration file."""
    command = [sys.executable, "-m", "mlx_lm", "lora", "--config", str(config), "--adapter-path", str(out)]
    start = time.perf_counter()
    output = subprocess.run(
        command, check=True, capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}
    ).stdout
    seconds = time.perf_counter() - start
    speeds = [
        float(match.group(3).replace(",", ""))
        for line in output.splitlines()
        if (match := _REPORT.match(_ANSI.sub("", line)))
    ]
    assert len(speeds) == STEPS, f"expected {STEPS} report lines from mlx-lm, got {len(speeds)}"
    return statistics.median(speeds[1:]), seconds


def run_payload(model: Path, data: Path, folder: Path) -> float:
    """Tokens/s of the trial's CPU path (the payload itself) on the same rows, steps, rank, batch and length."""
    folder.mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "data" / "train.jsonl").write_bytes((data / "train.jsonl").read_bytes())
    job = {
        "base_model": str(model),
        "train_file": "data/train.jsonl",
        "output_dir": "out",
        "method": "lora",
        "lora_r": RANK,
        "lora_alpha": 32,
        "seq_len": SEQ_LEN,
        "micro_batch": BATCH_SIZE,
        "grad_accum": 1,
        "learning_rate": LEARNING_RATE,
        "max_steps": STEPS,
        "checkpoint_steps": 0,
        "checkpoint_minutes": 0,
    }
    training = asyncio.run(train_with_payload(sys.executable, folder, job))
    return statistics.median(s.tokens_per_s or 0.0 for s in training.steps[1:])


def _rounds(model: Path, data: Path, folder: Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Each side's (tokens/s, seconds) per round; the order alternates, so neither side always runs second."""
    ours: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    for round_ in range(ROUNDS):
        if round_ % 2:
            bare.append(run_bare(folder / "ours-0" / CONFIG_FILE, folder / f"bare-{round_}"))
        ours.append(run_ours(model, data, folder / f"ours-{round_}"))  # round 0 runs ours first: it writes the config
        if not round_ % 2:
            bare.append(run_bare(folder / "ours-0" / CONFIG_FILE, folder / f"bare-{round_}"))
    return ours, bare


def run() -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = build_tiny_model(folder / "model", "llama").path
        data = folder / "data"
        data.mkdir()
        write_chat_dataset(data / "train.jsonl", count=400)
        write_chat_dataset(data / "valid.jsonl", count=16, seed=1)
        ours, bare = _rounds(model, data, folder)
        payload = [run_payload(model, data, folder / f"payload-{round_}") for round_ in range(2)]
    # Each round's two runs share the machine's mood of the moment: the median of the per-round ratios is steadier
    # than a ratio of two medians or of two best runs.
    speed = statistics.median(o / b for (o, _), (b, _) in zip(ours, bare, strict=True))
    wall = statistics.median(o / b for (_, o), (_, b) in zip(ours, bare, strict=True))
    print("train_with_mlx runs (tok/s):", ", ".join(f"{r:,.0f}" for r, _ in ours))
    print("python -m mlx_lm lora runs (tok/s):", ", ".join(f"{r:,.0f}" for r, _ in bare))
    print(
        f"medians: train_with_mlx {statistics.median(r for r, _ in ours):,.0f} tok/s in "
        f"{statistics.median(s for _, s in ours):.1f} s, mlx-lm {statistics.median(r for r, _ in bare):,.0f} tok/s "
        f"in {statistics.median(s for _, s in bare):.1f} s (CPU, {STEPS} steps; the seconds include imports, and "
        "ours the PEFT conversion)"
    )
    on_cpu = statistics.median(payload) / statistics.median(r for r, _ in bare)
    print("payload on the CPU runs (tok/s):", ", ".join(f"{r:,.0f}" for r in payload))
    return print_table(
        [
            Row(
                "trial on the CPU (payload) tokens/s / mlx-lm lora", on_cpu, None, "x", f">= {TARGET}", on_cpu >= TARGET
            ),
            Row("trial tokens/s / mlx-lm lora tokens/s", speed, None, "x", f">= {TARGET}", speed >= TARGET),
            Row("trial wall time / mlx-lm lora wall time", wall, None, "x", "reported", True),
        ]
    )
