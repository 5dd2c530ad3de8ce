"""DPO through the trainer payload against a bare TRL DPOTrainer script: pairs/s on the same model and pairs.

Both train the same small Llama (hidden 384, 4 layers) with LoRA on the CPU in fp32 on the same 200 preference pairs,
interleaved, four runs each, the best run of each compared (interference on a shared machine only slows a run down).
Pairs/s is ``train_samples_per_second`` as transformers reports it for both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.benchmarks.bench_payload import JOB as PAYLOAD_JOB
from tests.benchmarks.bench_payload import run_bare
from tests.benchmarks.common import Row, print_table
from tests.fixtures.preference_data import write_preference_dataset
from tests.fixtures.tiny_models import build_tiny_model
from trainer_payload.protocol import read_event_file

STEPS = 20
ROUNDS = 4
JOB = {**PAYLOAD_JOB, "objective": "dpo", "beta": 0.1, "max_steps": STEPS}  # the SFT bench's settings otherwise

BARE = """
import json, sys
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer
job = json.load(open(sys.argv[1]))
tok = AutoTokenizer.from_pretrained(job["base_model"])
rows = [json.loads(l) for l in open(sys.argv[2])]
cfg = DPOConfig(output_dir=sys.argv[3], per_device_train_batch_size=8, gradient_accumulation_steps=1,
                max_steps=job["max_steps"], learning_rate=job["learning_rate"], lr_scheduler_type="cosine",
                warmup_steps=0.03, seed=42, data_seed=42, logging_steps=1, save_strategy="steps", save_steps=10,
                save_total_limit=3, use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=True,
                gradient_checkpointing_kwargs={"use_reentrant": False}, max_length=256, beta=0.1,
                disable_tqdm=True, dataloader_num_workers=0)
trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(job["base_model"]), args=cfg,
                     train_dataset=Dataset.from_list(rows), processing_class=tok,
                     peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))
print("RESULT", trainer.train().metrics["train_samples_per_second"])
"""


def run_payload(folder: Path) -> float:
    """One payload run's pairs/s."""
    subprocess.run(["rm", "-rf", str(folder / "out")], check=True)
    subprocess.run(
        [sys.executable, "-m", "trainer_payload", "run", str(folder / "job.json")],
        check=True,
        capture_output=True,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )
    events = read_event_file(folder / "out" / "events.jsonl").events
    done = next(e for e in events if e["event"] == "done")
    return float(done["metrics"]["train_samples_per_second"])


def run() -> bool:
    """Prints the table; True when the payload keeps at least 0.95 of bare TRL's speed."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = build_tiny_model(folder / "model", "llama", hidden=384, layers=4)
        write_preference_dataset(folder / "train.jsonl", count=200)
        (folder / "job.json").write_text(json.dumps({**JOB, "base_model": str(model.path)}))
        ours, bare = [], []
        for _ in range(ROUNDS):
            ours.append(run_payload(folder))
            bare.append(run_bare(folder, BARE))
    ratio = max(ours) / max(bare)
    print(
        "payload runs (pairs/s):",
        ", ".join(f"{r:.1f}" for r in ours),
        "| bare DPOTrainer:",
        ", ".join(f"{r:.1f}" for r in bare),
    )
    return print_table(
        [Row("payload DPO pairs/s / bare TRL DPOTrainer pairs/s", ratio, None, "x", ">= 0.95", ratio >= 0.95)]
    )
