"""General ability, base against tuned: EleutherAI's lm-evaluation-harness on small tasks that run offline.

``python -m trainer_payload.general_check JOB`` (a child of the app): JOB is JSON with ``base``, ``adapter`` and
``tasks`` (a folder of lm-evaluation-harness task files, ``*.yaml``, whose ``DATA_DIR`` names that folder, beside
their JSONL rows). The base loads once with the adapter on top; the harness scores every row with the adapter on
(tuned) and off (base), so each row has both models' result and the app can compare them row by row.

Prints ``progress FRACTION TEXT`` lines, then ``result JSON``: for each task, the row ids and each model's 0/1 score
per row (``acc``). A base or adapter that does not load is a ``refused KIND DETAIL`` line, as in
:mod:`trainer_payload.compare`.
"""

from __future__ import annotations

import importlib.metadata
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainer_payload.compare import Say, child_main, load_tuned, print_progress

#: Rows scored per forward pass.
BATCH_SIZE = 8


def task_files(tasks: Path, into: Path) -> list[str]:
    """Writes each task file of ``tasks`` into ``into`` with its data folder filled in; returns the task names."""
    names: list[str] = []
    for source in sorted(tasks.glob("*.yaml")):
        text = source.read_text(encoding="utf-8").replace("DATA_DIR", tasks.resolve().as_posix())
        (into / source.name).write_text(text, encoding="utf-8")
        names.extend(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("task:"))
    return names


def _scores(samples: list[dict[str, Any]]) -> dict[int, float]:
    return {int(sample["doc_id"]): float(sample["acc"]) for sample in samples}


def run_check(base: Path, adapter: Path, tasks: Path, say: Say) -> dict[str, Any]:
    """Scores every task's rows with the tuned model, then the base; returns each model's score per row and task.

    Raises:
        CompareRefusedError: The base or the adapter does not load.
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    say(0.0, "loading the base model and the adapter")
    model, tokenizer = load_tuned(base, adapter)
    harness = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=BATCH_SIZE, device=str(model.device))
    with tempfile.TemporaryDirectory(prefix="rentune-tasks-") as folder:
        names = task_files(tasks, Path(folder))
        manager = TaskManager(include_path=folder)

        def scored(which: str, fraction: float) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
            say(fraction, f"lm-evaluation-harness: {', '.join(names)} with the {which} model")
            out = simple_evaluate(model=harness, tasks=names, task_manager=manager, log_samples=True, bootstrap_iters=0)
            rows = {name: _scores(out["samples"][name]) for name in names}
            return rows, {name: float(out["results"][name]["acc,none"]) for name in names}

        tuned, tuned_acc = scored("tuned", 0.1)
        with model.disable_adapter():
            base_rows, base_acc = scored("base", 0.55)
    say(1.0, "general ability checked")
    return {
        name: {
            "rows": sorted(tuned[name]),
            "base": [base_rows[name][row] for row in sorted(tuned[name])],
            "tuned": [tuned[name][row] for row in sorted(tuned[name])],
            "harness_acc": {"base": base_acc[name], "tuned": tuned_acc[name]},  # the harness's own aggregate
        }
        for name in names
    }


def main(argv: list[str]) -> int:
    """Runs the check described by ``argv[1]`` (JSON) and prints its result line (or its refusal)."""

    def check(job: dict[str, Any]) -> dict[str, Any]:
        result = run_check(Path(job["base"]), Path(job["adapter"]), Path(job["tasks"]), print_progress)
        return {"tasks": result, "harness": f"lm-evaluation-harness {importlib.metadata.version('lm_eval')}"}

    return child_main(argv, check)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
