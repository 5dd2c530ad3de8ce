"""The model card a published repo gets: what was trained, on how much data, how it went, what it cost.

Written from the run's record and events and the evaluation's ``report.json`` when there is one; never from the
data itself (no row of the dataset appears, only its size in rows and tokens). The front matter is the Hub's model
card metadata (``base_model``, ``library_name``, ``tags``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from desktop.core.judging.verdict import Outcome
from desktop.core.runs.progress import format_duration
from desktop.services.evaluation.general import task_title
from desktop.services.evaluation.report import outcome_words
from desktop.services.evaluation.run_facts import RunFacts

#: Training settings shown in the card, with their labels, in this order (others are left out).
SETTINGS = (
    ("method", "Method"),
    ("lora_r", "LoRA rank"),
    ("lora_alpha", "LoRA alpha"),
    ("lora_dropout", "LoRA dropout"),
    ("learning_rate", "Learning rate"),
    ("epochs", "Epochs"),
    ("max_steps", "Steps"),
    ("seq_len", "Sequence length"),
    ("micro_batch", "Micro-batch"),
    ("grad_accum", "Gradient accumulation"),
)


def read_evaluation(report: Path) -> dict[str, Any] | None:
    """The evaluation's ``report.json``, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_card(
    name: str, base_model: str, run: RunFacts | None, evaluation: dict[str, Any] | None, files: list[str]
) -> str:
    """The README.md of the published repo."""
    lines = ["---", f"base_model: {json.dumps(base_model)}", "library_name: peft", "tags:"]
    lines += ["- rentune", "- lora" if not run or run.method != "full" else "- full-fine-tune", "---", ""]
    lines += [f"# {name}", "", f"A fine-tune of `{base_model}` made with Rentune.", ""]
    if run is not None:
        lines += _training(run)
    if evaluation is not None:
        lines += _evaluation(evaluation)
    lines += ["## Files", "", *(f"- `{path}`" for path in files), ""]
    lines += _usage(files)
    return "\n".join(lines)


def _training(run: RunFacts) -> list[str]:
    lines = ["## Training", "", "| | |", "|---|---|"]
    lines += [f"| {label} | {run.training[key]} |" for key, label in SETTINGS if key in run.training]
    if run.examples is not None:
        lines.append(f"| Training rows | {run.examples:,} |")
    if run.tokens is not None:
        lines.append(f"| Tokens trained on | {run.tokens:,.0f} |")
    if run.gpu:
        lines.append(f"| GPU | {run.gpu} |")
    lines.append(f"| Training time | {format_duration(run.trained_seconds)} |")
    if run.usd is not None:
        lines.append(f"| Cost | ${run.usd:,.2f} |")
    if run.losses:
        (first_step, first), (last_step, last) = run.losses[0], run.losses[-1]
        lines += ["", f"Training loss went from {first:.4f} (step {first_step}) to {last:.4f} (step {last_step})."]
        lines += ["", "![Loss during training](loss.svg)"]
    return [*lines, ""]


def _evaluation(report: dict[str, Any]) -> list[str]:
    lines = ["## Evaluation against the base model", ""]
    outcome, p_value = report.get("outcome"), report.get("p_value")
    fixed, broke = len(report.get("fixed") or []), len(report.get("broke") or [])
    if outcome in set(Outcome) and isinstance(p_value, (int, float)):
        words = outcome_words(Outcome(outcome), fixed, broke)
        lines += [f"{words}: {fixed} held-out rows fixed, {broke} broken (exact McNemar p = {p_value:.3g}).", ""]
    lines += ["| Check | Base | Fine-tuned |", "|---|---|---|"]
    for score in report.get("scores") or []:
        rows = score.get("rows") or 0
        if rows:
            base, tuned = score.get("base_right", 0), score.get("tuned_right", 0)
            lines.append(f"| {score.get('check')} | {base}/{rows} | {tuned}/{rows} |")
    base_loss, tuned_loss = report.get("base_loss"), report.get("tuned_loss")
    if isinstance(base_loss, (int, float)) and isinstance(tuned_loss, (int, float)):
        lines.append(f"| mean loss on the references | {base_loss:.4f} | {tuned_loss:.4f} |")
    return [*lines, "", *_general(report.get("general"))]


def _general(general: Any) -> list[str]:
    """The general-ability check's table (lm-evaluation-harness), when the evaluation ran it."""
    tasks = general.get("tasks") if isinstance(general, dict) else None
    if not isinstance(tasks, list) or not tasks:
        return []
    lines = [f"General ability ({general.get('harness')}, small offline tasks):", ""]
    lines += ["| Task | Base | Fine-tuned | Difference (95% interval) |", "|---|---|---|---|"]
    for task in tasks:
        try:
            base, tuned, low, high = (float(task[key]) for key in ("base", "tuned", "low", "high"))
        except (KeyError, TypeError, ValueError):
            continue
        lines.append(
            f"| {task_title(str(task.get('task')))} | {base:.0%} | {tuned:.0%} | "
            f"{(tuned - base) * 100:+.0f} points ({low * 100:+.0f} to {high * 100:+.0f}) |"
        )
    return [*lines, ""]


def _usage(files: list[str]) -> list[str]:
    lines = ["## Use", ""]
    if "adapter_config.json" in files:
        load = 'model = AutoPeftModelForCausalLM.from_pretrained("THIS_REPO")'
        lines += ["```python", "from peft import AutoPeftModelForCausalLM", "", load, "```", ""]
    ggufs = [path for path in files if path.endswith(".gguf")]
    if ggufs:
        lines += ["```sh", f"llama-server -hf THIS_REPO --hf-file {ggufs[0]}", "```", ""]
    return lines
