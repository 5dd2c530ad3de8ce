"""Base vs fine-tuned on held-out chats: each example's two greedy answers and each model's mean loss.

The base weights load once; the adapter sits on top as a PEFT model, and base answers are taken with the adapter
switched off (``disable_adapter``). The loss is teacher-forced on the reference answer's tokens only (the last
assistant turn, through the end-of-turn marker), averaged over those tokens across all rows. Everything heavy runs
in a worker thread and stops between examples when the awaiting task is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.data.findings import CODE_INFO, Severity
from desktop.core.data.report import DataReport
from desktop.services.data.check import CheckOutcome, iter_conversations
from desktop.services.data.reader import DatasetFileError
from desktop.services.local.common import LocalInputError, LocalToolError, Progress, no_progress
from desktop.services.local.fit import ensure_fits

Messages = list[dict[str, Any]]

#: Config fields that must agree between the base an adapter was trained on and the base it is used with.


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
    """

    base: Path
    adapter: Path
    eval_file: Path
    base_loss: float
    tuned_loss: float
    examples: list[CompareExample]
    usable_rows: int

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


def read_eval_rows(path: Path, max_examples: int) -> tuple[list[tuple[int, Messages]], int]:
    """The first ``max_examples`` usable conversations of ``path`` (with their lines), and how many are usable.

    Rows are read and checked by the data service, so any format ``rentune data check`` accepts works here.

    Raises:
        LocalToolError: The file is unreadable or has no usable row (the message names the first bad line).
    """
    outcome = CheckOutcome(DataReport(str(path)))
    rows: list[tuple[int, Messages]] = []
    usable = 0
    try:
        for line, messages in iter_conversations(path, outcome, None, None):
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


def split_row(messages: Messages) -> tuple[Messages, str]:
    """The conversation before the last assistant turn, and that turn's text (the reference answer)."""
    last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    return messages[:last], str(messages[last].get("content") or "")


def prompt_text(prompt: Messages) -> str:
    """A prompt as readable text: a lone user message is its content, else ``role: content`` per message."""
    if len(prompt) == 1 and prompt[0].get("role") == "user":
        return str(prompt[0].get("content") or "")
    return "\n\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in prompt)


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
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def report(text: str, fraction: float | None) -> None:
        if not stop.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed after a cancel
                loop.call_soon_threadsafe(progress, text, fraction)

    work = _Comparison(base, adapter, max_new_tokens, report, stop)
    try:
        losses, examples = await asyncio.to_thread(work.run, rows)
    except asyncio.CancelledError:
        stop.set()  # the worker stops before its next example
        raise
    return CompareResult(base, adapter, eval_file, losses[0], losses[1], examples, usable)


class _StoppedError(Exception):
    """The comparison was cancelled between examples."""


class _Comparison:
    """The blocking part: loads the models once, then answers and scores each row (runs in a worker thread)."""

    def __init__(
        self, base: Path, adapter: Path, max_new_tokens: int, progress: Progress, stop: threading.Event
    ) -> None:
        self.base, self.adapter, self.max_new_tokens = base, adapter, max_new_tokens
        self.progress, self.stop = progress, stop

    def run(self, rows: list[tuple[int, Messages]]) -> tuple[tuple[float, float], list[CompareExample]]:
        """Loads, then goes through ``rows``; returns (base loss, tuned loss) and the examples."""
        self.progress("loading the base model and the adapter", None)
        model, tokenizer = load_tuned(self.base, self.adapter)
        sums, tokens, examples = [0.0, 0.0], 0, []
        for index, (line, messages) in enumerate(rows):
            if self.stop.is_set():
                raise _StoppedError
            self.progress(f"example {index + 1} of {len(rows)}", index / len(rows))
            prompt, reference = split_row(messages)
            prompt_ids, full_ids = _token_ids(tokenizer, prompt, messages)
            answers = []
            for slot, tuned in enumerate((False, True)):
                loss, count = _scored(model, tuned, prompt_ids, full_ids)
                sums[slot] += loss
                answers.append(_answer(model, tokenizer, tuned, prompt_ids, self.max_new_tokens))
            tokens += count
            examples.append(CompareExample(prompt_text(prompt), reference, answers[0], answers[1], line))
        self.progress(f"compared {len(rows)} examples", 1.0)
        return (sums[0] / max(1, tokens), sums[1] / max(1, tokens)), examples


# -- models (torch, transformers and peft are imported here only) -----------------------------------------------------


def load_tuned(base: Path, adapter: Path) -> tuple[Any, Any]:
    """The base model with the adapter on top (float32, CPU, eval mode) and the base's tokenizer.

    Raises:
        LocalToolError: The base or adapter does not load, or the adapter was trained on another base model.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ensure_fits(adapter, base)
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise LocalInputError(f"the base model {base} does not load ({_first_line(exc)}); pass --base FOLDER") from exc
    if not tokenizer.chat_template:
        raise LocalInputError(f"the base model {base} has no chat template; pass the --base it was trained on")
    return _with_adapter(model, base, adapter), tokenizer


def _with_adapter(model: Any, base: Path, adapter: Path) -> Any:
    from peft import PeftModel

    try:
        tuned = PeftModel.from_pretrained(model, adapter)
    except Exception as exc:  # peft and safetensors raise many types; each becomes one line
        mismatch = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line]
        if mismatch:
            raise LocalInputError(
                f"this adapter was trained on another base model: its weights do not fit {base} "
                f"({mismatch[0][:400]}); pass the --base it was trained on"
            ) from exc
        raise LocalInputError(
            f"the adapter {adapter} does not load ({_first_line(exc)[:200]}); its files are damaged: bring it home "
            "again (rentune pull RUN) or pass another adapter"
        ) from exc
    tuned.eval()
    return tuned


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _token_ids(tokenizer: Any, prompt: Messages, messages: Messages) -> tuple[list[int], list[int]]:
    """Token ids of the prompt (with the assistant's opening) and of the whole conversation."""
    try:
        chat_prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        full_text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as exc:  # a template's own errors (jinja) vary
        raise LocalToolError(f"the base model's chat template cannot format a row ({_first_line(exc)})") from exc
    prompt_ids = tokenizer(chat_prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    if full_ids[: len(prompt_ids)] != prompt_ids:  # a template that rewrites earlier turns: score the answer alone
        answer = str(messages[-1].get("content") or "") + (tokenizer.eos_token or "")
        full_ids = prompt_ids + tokenizer(answer, add_special_tokens=False)["input_ids"]
    return prompt_ids, full_ids


def _scored(model: Any, tuned: bool, prompt_ids: list[int], full_ids: list[int]) -> tuple[float, int]:
    """The summed cross-entropy over the reference tokens (after the prompt), and how many there are."""
    import torch

    ids = torch.tensor([full_ids])
    with torch.inference_mode(), _adapter_state(model, tuned):
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    targets = ids[0, len(prompt_ids) :]
    loss = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    return float(loss), int(targets.numel())


def _answer(model: Any, tokenizer: Any, tuned: bool, prompt_ids: list[int], max_new_tokens: int) -> str:
    """The greedy answer to the prompt, without special tokens."""
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.inference_mode(), _adapter_state(model, tuned):
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
    return str(tokenizer.decode(out[0, len(prompt_ids) :], skip_special_tokens=True)).strip()


def _adapter_state(model: Any, tuned: bool) -> Any:
    return contextlib.nullcontext() if tuned else model.disable_adapter()
