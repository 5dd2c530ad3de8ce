"""Base vs fine-tuned on held-out chats: each example's two greedy answers and each model's mean loss.

The rows are read and checked here (any format the data check accepts); the models answer in a child Python
(:mod:`trainer_payload.compare`, the same comparison a rented machine runs before it is let go, described there),
so a cancel kills it at once and torch's memory leaves with it. A ``result`` the machine sent is read field by
field (:func:`result_from_json`).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.data.findings import CODE_INFO, Severity
from desktop.core.data.pairs import side_conversation
from desktop.core.data.report import DataReport
from desktop.services.data.check import CheckOutcome, iter_training_rows
from desktop.services.data.reader import DatasetFileError
from desktop.services.local.common import LocalInputError, LocalToolError, Progress, no_progress
from desktop.services.local.fit import ensure_fits
from desktop.services.local.toolenv import run_python

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class CompareExample:
    """One held-out conversation and what each model answered.

    Attributes:
        prompt: The conversation before the last assistant turn, as text (a lone user message is its content).
        reference: The last assistant message: the answer the data expects.
        base_answer: The base model's greedy answer.
        tuned_answer: The fine-tuned model's greedy answer.
        line: The row's line in the eval file.
    """

    prompt: str
    reference: str
    base_answer: str
    tuned_answer: str
    line: int


@dataclass(frozen=True)
class CompareResult:
    """The comparison as a whole.

    Attributes:
        base: The base model folder.
        adapter: The adapter folder.
        eval_file: The held-out chat file.
        base_loss: The base model's mean loss per reference token (lower is better).
        tuned_loss: The fine-tuned model's mean loss per reference token.
        examples: One per row used, in file order.
        usable_rows: Rows of the file without errors; more than ``len(examples)`` when the comparison was cut.
        judged_on: Where the models answered, when not on this computer (``the rented machine``).
    """

    base: Path
    adapter: Path
    eval_file: Path
    base_loss: float
    tuned_loss: float
    examples: list[CompareExample]
    usable_rows: int
    judged_on: str | None = None

    @property
    def cut(self) -> bool:
        """Whether rows were left out to keep the comparison short."""
        return self.usable_rows > len(self.examples)

    def to_json(self) -> dict[str, Any]:
        """``base_loss``, ``tuned_loss`` and ``examples`` (prompt, reference, base and tuned answer) as JSON."""
        return {
            "base_loss": self.base_loss,
            "tuned_loss": self.tuned_loss,
            "examples": [
                {
                    "prompt": e.prompt,
                    "reference": e.reference,
                    "base_answer": e.base_answer,
                    "tuned_answer": e.tuned_answer,
                }
                for e in self.examples
            ],
        }


# -- the eval rows ---------------------------------------------------------------------------------------------------


#: Why raw text cannot be compared answer by answer, and what measures continued pre-training instead.
RAW_TEXT_WORDS = (
    "{path} holds raw text (continued pre-training), not prompts to answer: such a run is measured by its held-out "
    "perplexity before and after training, which the machine reports when the run ends (the monitor's Perplexity "
    "row, or rentune status RUN_ID). To compare answers anyway, give a JSONL file of held-out conversations"
)


def read_eval_rows(path: Path, max_examples: int) -> tuple[list[tuple[int, Messages]], int]:
    """The first ``max_examples`` usable conversations of ``path`` (with their lines), and how many are usable.

    Rows are read and checked by the data service, so any format ``rentune data check`` accepts works here; a
    preference pair is its prompt with the chosen answer as the reference.

    Raises:
        LocalToolError: The file is unreadable or has no usable row (the message names the first bad line).
    """
    outcome = CheckOutcome(DataReport(str(path)))
    rows: list[tuple[int, Messages]] = []
    usable = 0
    try:
        for line, row in iter_training_rows(path, outcome, None, None):
            if "text" in row:
                raise LocalInputError(RAW_TEXT_WORDS.format(path=path))
            messages = row["messages"] if "messages" in row else side_conversation(row, "chosen")
            usable += 1
            if len(rows) < max_examples:
                rows.append((line, messages))
    except DatasetFileError as exc:
        raise LocalInputError(str(exc)) from exc
    except OSError as exc:
        raise LocalInputError(f"{path} cannot be read ({exc.strerror or exc}); check the file") from exc
    if not rows:
        raise LocalInputError(_no_rows_message(path, outcome.report))
    return rows, usable


def _no_rows_message(path: Path, report: DataReport) -> str:
    for code, summary in report.summaries.items():
        info = CODE_INFO[code]
        if info.severity is Severity.ERROR and summary.lines:
            where = summary.details[0] if summary.details else f"line {summary.lines[0]}"
            return f"{path} has no usable chat row; the first problem: {info.title}, {where}; {info.fix}"
    return f'{path} has no chat rows; pass --eval a JSONL file of {{"messages": [...]}} rows'


# -- the comparison --------------------------------------------------------------------------------------------------


async def compare_adapter(
    base: Path,
    adapter: Path,
    eval_file: Path,
    *,
    max_examples: int = 50,
    max_new_tokens: int = 128,
    progress: Progress = no_progress,
) -> CompareResult:
    """Answers each held-out row with the base and the fine-tuned model and measures each model's mean loss.

    The models run in a child Python (:mod:`trainer_payload.compare`, the comparison a rented machine runs before
    it is let go); cancelling the awaiting task kills it at once.

    Args:
        base: The base model folder (weights, tokenizer with a chat template).
        adapter: The PEFT LoRA adapter folder trained on ``base``.
        eval_file: Held-out chats (``{"messages": [...]}`` rows, or any format the data check accepts).
        max_examples: Rows used at most (the first ones); :attr:`CompareResult.cut` says when more were there.
        max_new_tokens: Longest answer generated, in tokens.
        progress: Told about loading and each example (called on the event loop).

    Raises:
        LocalToolError: Unusable eval file, a base or adapter that does not load, or an adapter for another base.
    """
    rows, usable = read_eval_rows(eval_file, max_examples)
    ensure_fits(adapter, base)
    with tempfile.TemporaryDirectory(prefix="rentune-compare-") as scratch:
        rows_file = Path(scratch) / "rows.jsonl"
        lines = (json.dumps({"line": line, "messages": messages}) for line, messages in rows)
        rows_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
        job = {"base": str(base), "adapter": str(adapter), "rows": str(rows_file), "max_new_tokens": max_new_tokens}
        result = await run_model_child("trainer_payload.compare", job, base, adapter, progress, what="the comparison")
    return result_from_json(result, base, adapter, eval_file, usable)


def result_from_json(
    result: dict[str, Any], base: Path, adapter: Path, eval_file: Path, usable: int, *, judged_on: str | None = None
) -> CompareResult:
    """The :class:`CompareResult` of a comparison's ``result`` JSON (at home, or brought home from the machine).

    Raises:
        ValueError: A field is missing or of the wrong type (the JSON came from a machine: untrusted).
    """
    try:
        examples = [
            CompareExample(
                str(e["prompt"]), str(e["reference"]), str(e["base_answer"]), str(e["tuned_answer"]), int(e["line"])
            )
            for e in result["examples"]
        ]
        losses = float(result["base_loss"]), float(result["tuned_loss"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the comparison's result is not one Rentune wrote ({type(exc).__name__}: {exc})") from None
    return CompareResult(
        base, adapter, eval_file, losses[0], losses[1], examples, max(usable, len(examples)), judged_on=judged_on
    )


async def run_model_child(
    module: str,
    job: dict[str, Any],
    base: Path,
    adapter: Path,
    progress: Progress,
    *,
    what: str,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Runs ``python -m MODULE JOB`` (a payload module that loads base + adapter) and returns its ``result``.

    Its ``progress`` lines go to ``progress``; its refusal (the base or adapter does not load) becomes the message
    naming the fix (:func:`refusal_words`).

    Raises:
        LocalToolError: The child failed, refused, or ended without a result.
    """
    result: dict[str, Any] = {}
    refused: list[tuple[str, str]] = []

    def on_line(line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "progress":
            fraction, _, text = rest.partition(" ")
            progress(text, None if fraction == "-" else float(fraction))
        elif kind == "result":
            result.update(json.loads(rest))
        elif kind == "refused":
            what, _, detail = rest.partition(" ")
            refused.append((what, detail))

    env = os.environ | {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"} | (extra_env or {})
    try:
        await run_python(["-m", module, json.dumps(job)], env=env, on_line=on_line, what=what)
    except LocalToolError:
        if refused:
            raise LocalInputError(refusal_words(*refused[-1], base, adapter)) from None
        raise
    if not result:
        raise LocalToolError(f"{what} ended without a result; see the log for its output")
    return result


def refusal_words(kind: str, detail: str, base: Path, adapter: Path) -> str:
    """What the comparison's ``refused`` line means for the user, and the fix."""
    if kind == "mismatch":
        return (
            f"this adapter was trained on another base model: its weights do not fit {base} ({detail}); pass the "
            "--base it was trained on"
        )
    if kind == "adapter":
        return (
            f"the adapter {adapter} does not load ({detail}); its files are damaged: bring it home again "
            "(rentune pull RUN) or pass another adapter"
        )
    if kind == "template":
        return f"the base model {base} has no chat template; pass the --base it was trained on"
    if kind == "format":
        return f"the base model's chat template cannot format a row ({detail})"
    return f"the base model {base} does not load ({detail}); pass --base FOLDER"
