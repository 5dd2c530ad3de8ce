"""A SPEC.toml that rents a machine to teach a model the pattern (tests/fixtures/adapters.py), for the end-to-end
tests of what the machine does after training: exporting there and serving from there."""

from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path
from typing import Protocol

from tests.fixtures.adapters import PATTERN, TARGET_MODULES


class Cloud(Protocol):
    """The fake cloud the spec rents from (``tests.runs.test_rented_runs.CloudUnderTest``)."""

    name: str
    gpu: str


def write_pattern_spec(
    folder: Path, base: Path, cloud: Cloud, *, max_steps: int = 60, extra: str = "", held_out: bool = False
) -> Path:
    """Writes ``folder/SPEC.toml`` training ``base`` on the pattern for ``max_steps`` on ``cloud``; ``extra`` is TOML
    appended as it is (an ``[export]`` or ``[serve]`` table); ``held_out`` adds the pattern as ``[data] eval``."""
    train = folder / "pattern.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in PATTERN]
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    if held_out:
        (folder / "held-out.jsonl").write_text(train.read_text())
    training = {
        "method": "lora",
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "target_modules": TARGET_MODULES,
        "seq_len": 64,
        "micro_batch": len(PATTERN),
        "grad_accum": 1,
        "learning_rate": 0.003,
        "max_steps": max_steps,
        "warmup_ratio": 0.0,
        "lr_scheduler": "constant",
        "checkpoint_steps": 20,
        "checkpoint_minutes": 0,
        "calibration_steps": 0,
    }
    compute = {"provider": cloud.name, "gpu": cloud.gpu, "python": sys.executable, "user": getpass.getuser()}
    lines = ["[model]", f'base = "{base}"', "", "[data]", f'train = "{train}"']
    lines += [f'eval = "{folder / "held-out.jsonl"}"'] if held_out else []
    lines += ["", "[training]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in training.items()]
    lines += ["", "[compute]", *(f"{k} = {json.dumps(v)}" for k, v in compute.items()), "", extra]
    spec = folder / "SPEC.toml"
    spec.write_text("\n".join(lines))
    return spec
