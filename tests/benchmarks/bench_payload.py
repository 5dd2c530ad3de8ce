"""Trainer payload: its training tokens/s against a bare TRL script with the same config, and time to first step.

Both train the same small Llama (hidden 384, 4 layers) with LoRA on the CPU in fp32 (as the payload does on a CPU;
SFTConfig alone would default to bf16 autocast), interleaved, four runs each; the
best run of each is compared; tokens/s
is tokens trained / train_runtime as transformers reports it, so both are measured the same way.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.common import Row, print_table
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import build_tiny_model
from trainer_payload.protocol import read_event_file

STEPS = 30
ROUNDS = 4
JOB = {
    "train_file": "train.jsonl",
    "output_dir": "out",
    "method": "lora",
    "lora_r": 16,
    "seq_len": 256,
    "micro_batch": 8,
    "grad_accum": 1,
    "learning_rate": 0.001,
    "max_steps": STEPS,
    "checkpoint_steps": 10,
    "checkpoint_minutes": 0,
}

BARE = """
import json, sys
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer
job = json.load(open(sys.argv[1]))
tok = AutoTokenizer.from_pretrained(job["base_model"])
rows = [json.loads(l) for l in open(sys.argv[2])]
cfg = SFTConfig(output_dir=sys.argv[3], per_device_train_batch_size=8, gradient_accumulation_steps=1,
                max_steps=job["max_steps"], learning_rate=job["learning_rate"], lr_scheduler_type="cosine",
                warmup_steps=0.03, seed=42, data_seed=42, logging_steps=1, save_strategy="steps", save_steps=10,
                save_total_limit=3, use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=True,
                gradient_checkpointing_kwargs={"use_reentrant": False}, max_length=256, assistant_only_loss=True,
                disable_tqdm=True, dataloader_num_workers=0)
trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(job["base_model"]), args=cfg,
                     train_dataset=Dataset.from_list(rows), processing_class=tok,
                     peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))
metrics = trainer.train().metrics
tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h][-1]
print("RESULT", tokens / metrics["train_runtime"])
"""


def run_payload(folder: Path) -> tuple[float, float]:
    out = folder / "out"
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    start = time.time()
    subprocess.run(
        [sys.executable, "-m", "trainer_payload", "run", str(folder / "job.json")],
        check=True,
        capture_output=True,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )
    events = read_event_file(out / "events.jsonl").events
    first_step = next(e["ts"] for e in events if e["event"] == "step")
    done = next(e for e in events if e["event"] == "done")
    tokens = [e["tokens"] for e in events if e["event"] == "step"][-1]
    return tokens / done["metrics"]["train_runtime"], first_step - start


def run_bare(folder: Path, script: str = BARE) -> float:
    """One run of a bare TRL ``script`` on the folder's job and data; the number it prints after ``RESULT``."""
    out = subprocess.run(
        [sys.executable, "-c", script, str(folder / "job.json"), str(folder / "train.jsonl"), str(folder / "bare-out")],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    ).stdout
    return float(next(line for line in out.splitlines() if line.startswith("RESULT")).split()[1])


def bookkeeping_ms_per_step() -> float:
    """What the payload's own callback costs per training step (event write with fsync, timers, flags)."""
    from types import SimpleNamespace

    from trainer_payload.protocol import EventWriter, JobSpec
    from trainer_payload.train import Stop, _events_callback

    with tempfile.TemporaryDirectory() as tmp:
        spec = JobSpec.from_dict({"base_model": "m", "train_file": "t", "output_dir": tmp})
        callback = _events_callback(spec, EventWriter(Path(tmp) / "events.jsonl"), Stop())
        state = SimpleNamespace(global_step=1, epoch=0.1, max_steps=1000)
        start = time.perf_counter()
        for step in range(500):
            callback.on_log(None, state, None, logs={"loss": 1.0, "learning_rate": 1e-4, "num_tokens": step * 100.0})
            callback.on_step_end(None, state, SimpleNamespace(should_save=False, should_training_stop=False))
        return (time.perf_counter() - start) / 500 * 1000


def run() -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = build_tiny_model(folder / "model", "llama", hidden=384, layers=4)
        write_chat_dataset(folder / "train.jsonl", count=400)
        (folder / "job.json").write_text(json.dumps({**JOB, "base_model": str(model.path)}))
        ours, bare, first = [], [], []
        for _ in range(ROUNDS):
            rate, to_first = run_payload(folder)
            ours.append(rate)
            first.append(to_first)
            bare.append(run_bare(folder))
    # Best of N: on a shared 2-core machine interference only ever slows a run down, so the fastest run of each
    # is the fairest estimate of what the code itself costs.
    ratio = max(ours) / max(bare)
    print(
        "payload runs (tok/s):",
        ", ".join(f"{r:,.0f}" for r in ours),
        "| bare TRL runs:",
        ", ".join(f"{r:,.0f}" for r in bare),
    )
    print(
        f"payload best {max(ours):,.0f} tok/s, bare TRL best {max(bare):,.0f} tok/s; "
        f"time from run to first step event {statistics.median(first):.1f} s (CPU, imports included)"
    )
    per_step = bookkeeping_ms_per_step()
    step_ms = JOB["micro_batch"] * 1000 * 100 / max(bare)  # ~100 tokens per example
    return print_table(
        [
            Row("payload tokens/s / bare TRL tokens/s", ratio, None, "x", ">= 0.95", ratio >= 0.95),
            Row(
                "payload bookkeeping per step (ms)",
                per_step,
                step_ms,
                "ms",
                "< 1 % of a step",
                per_step < 0.01 * step_ms,
            ),
            Row("time from run to first step (s)", statistics.median(first), None, "s", "reported", True),
        ]
    )
