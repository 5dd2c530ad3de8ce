"""Full-fine-tune DPO's reference copy in memory, measured on the CPU beside the planner's figure for it.

The same full DPO through the payload twice on a random-weight Llama (hidden 1024, 8 layers, about 100 M
parameters) in fp32: capped at max_steps, TRL keeps a frozen reference copy of the model; trained every epoch, the
reference log-probabilities are computed once before training and no copy is kept
(``trainer_payload.protocol.precomputes_reference``). The difference of the two runs' peak resident memory is the
copy; the planner's ``reference_model`` item counts it in bf16 (2 bytes a parameter) for a GPU, so here it is
compared with the same parameters at fp32's 4 bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from desktop.core.sizing.architecture import architecture_from_config
from desktop.core.sizing.memory import reference_gb
from desktop.core.sizing.setup import Method, Objective, TrainingSetup
from tests.benchmarks.common import Row, print_table
from tests.fixtures.preference_data import write_preference_dataset
from tests.fixtures.tiny_models import build_tiny_model

PAIRS = 8
JOB = {
    "train_file": "train.jsonl",
    "output_dir": "out",
    "objective": "dpo",
    "method": "full",
    "seq_len": 64,
    "micro_batch": 2,
    "grad_accum": 1,
    "epochs": 1,
    "learning_rate": 1e-5,
    "checkpoint_steps": 0,
    "checkpoint_minutes": 0,
}


def peak_gb(folder: Path, max_steps: int) -> float:
    """One payload run's peak resident memory (GB): with the reference copy (capped) or without (every epoch)."""
    subprocess.run(["rm", "-rf", str(folder / "out")], check=True)
    (folder / "job.json").write_text(json.dumps({**JOB, "max_steps": max_steps, "base_model": str(folder / "model")}))
    out = folder / "peak.json"
    subprocess.run(
        [sys.executable, "-m", "desktop.services.trial.peak_memory", str(out), "trainer_payload", "run",
         str(folder / "job.json")],
        check=True,
        capture_output=True,
        env=os.environ | {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    return float(json.loads(out.read_text()))


def run() -> bool:
    """Prints the table; True when the measured copy is within a quarter of the planner's parameters x 4 bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_tiny_model(folder / "model", "llama", hidden=1024, layers=8)
        write_preference_dataset(folder / "train.jsonl", count=PAIRS)
        arch = architecture_from_config(json.loads((folder / "model" / "config.json").read_text()), "bench")
        capped = [peak_gb(folder, PAIRS // 2) for _ in range(2)]
        precomputed = [peak_gb(folder, 0) for _ in range(2)]
    measured = min(capped) - min(precomputed)
    planned_bf16 = reference_gb(arch, TrainingSetup(method=Method.FULL, objective=Objective.DPO))
    planned_fp32 = planned_bf16 * 2
    print(
        f"{arch.total_params / 1e6:.0f} M parameters; peak RSS with the copy: "
        + ", ".join(f"{g:.2f}" for g in capped)
        + " GB; precomputed: "
        + ", ".join(f"{g:.2f}" for g in precomputed)
        + f" GB; planner's copy {planned_bf16:.3f} GB in bf16, {planned_fp32:.3f} GB at fp32"
    )
    ratio = measured / planned_fp32
    return print_table(
        [
            Row(
                "measured reference copy / planner's copy at fp32",
                ratio,
                None,
                "x",
                "0.75 to 1.25",
                0.75 <= ratio <= 1.25,
            )
        ]
    )
