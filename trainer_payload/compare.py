"""Base vs fine-tuned on held-out chats: each row's two greedy answers and each model's mean loss.

The same comparison runs at home (``python -m trainer_payload.compare JOB``, a child of the app, so torch's memory
leaves with it and a cancel stops it at once) and on the rented machine before it is let go (inside the export job:
the GPU is paid for already). The base weights load once; the adapter sits on top as a PEFT model, and base answers
are taken with the adapter switched off (``disable_adapter``). The loss is teacher-forced on the reference answer's
tokens only (the last assistant turn, through the end-of-turn marker), averaged over those tokens across all rows.

The child prints ``progress FRACTION TEXT`` lines, then ``result JSON``; a base or adapter that does not load is one
``refused KIND DETAIL`` line and exit code :data:`REFUSED_EXIT` (the app words the fix).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Messages = list[dict[str, Any]]
#: ``say(fraction, text)``: what the comparison is doing.
Say = Callable[[float | None, str], None]
#: The child's exit code when the base or adapter does not load (its ``refused`` line says why).
REFUSED_EXIT = 3


class CompareRefusedError(Exception):
    """The base or the adapter does not load.

    Attributes:
        kind: ``base`` (the base does not load), ``template`` (it has no chat template), ``mismatch`` (the adapter's
            weights do not fit the base) or ``adapter`` (the adapter does not load).
        detail: The library's own words, one line.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def split_row(messages: Messages) -> tuple[Messages, str]:
    """The conversation before the last assistant turn, and that turn's text (the reference answer)."""
    last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    return messages[:last], str(messages[last].get("content") or "")


def prompt_text(prompt: Messages) -> str:
    """A prompt as readable text: a lone user message is its content, else ``role: content`` per message."""
    if len(prompt) == 1 and prompt[0].get("role") == "user":
        return str(prompt[0].get("content") or "")
    return "\n\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in prompt)


def compare_rows(
    base: Path,
    adapter: Path,
    rows: list[tuple[int, Messages]],
    max_new_tokens: int,
    say: Say,
) -> dict[str, Any]:
    """Loads base + adapter once, then answers and scores each row with both models.

    Returns:
        ``base_loss``, ``tuned_loss`` and ``examples`` (``line``, ``prompt``, ``reference``, ``base_answer``,
        ``tuned_answer``), in the order of ``rows``.

    Raises:
        CompareRefusedError: The base or the adapter does not load.
    """
    say(None, "loading the base model and the adapter")
    model, tokenizer = load_tuned(base, adapter)
    sums, tokens, examples = [0.0, 0.0], 0, []
    for index, (line, messages) in enumerate(rows):
        say(index / len(rows), f"example {index + 1} of {len(rows)}")
        prompt, reference = split_row(messages)
        prompt_ids, full_ids = token_ids(tokenizer, prompt, messages)
        answers = []
        for slot, tuned in enumerate((False, True)):
            loss, count = answer_loss(model, tuned, prompt_ids, full_ids)
            sums[slot] += loss
            answers.append(_answer(model, tokenizer, tuned, prompt_ids, max_new_tokens))
        tokens += count
        examples.append(
            {
                "line": line,
                "prompt": prompt_text(prompt),
                "reference": reference,
                "base_answer": answers[0],
                "tuned_answer": answers[1],
            }
        )
    say(1.0, f"compared {len(rows)} examples")
    return {"base_loss": sums[0] / max(1, tokens), "tuned_loss": sums[1] / max(1, tokens), "examples": examples}


# -- models (torch, transformers and peft are imported here only) -----------------------------------------------------


def _device_and_dtype() -> tuple[str, Any]:
    """A GPU in bfloat16 where there is one (the rented machine), else the CPU in float32."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return "cpu", torch.float32


def load_tuned(base: Path, adapter: Path) -> tuple[Any, Any]:
    """The base model with the adapter on top (eval mode) and the base's tokenizer.

    Raises:
        CompareRefusedError: The base or adapter does not load, or the adapter's weights do not fit the base.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device, dtype = _device_and_dtype()
    # On a GPU machine accelerate places the layers (spilling to its memory when the GPU is too small for 16 bits).
    placement = {"device_map": "auto"} if device == "cuda" else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, **placement)
    except (OSError, ValueError, KeyError) as exc:
        raise CompareRefusedError("base", _first_line(exc)) from exc
    if not tokenizer.chat_template:
        raise CompareRefusedError("template", f"{base} has no chat template")
    return _with_adapter(model, adapter), tokenizer


def _with_adapter(model: Any, adapter: Path) -> Any:
    from peft import PeftModel

    try:
        tuned = PeftModel.from_pretrained(model, adapter)
    except Exception as exc:  # peft and safetensors raise many types; each becomes one line
        mismatch = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line]
        if mismatch:
            raise CompareRefusedError("mismatch", mismatch[0][:400]) from exc
        raise CompareRefusedError("adapter", _first_line(exc)[:200]) from exc
    tuned.eval()
    return tuned


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def token_ids(tokenizer: Any, prompt: Messages, messages: Messages) -> tuple[list[int], list[int]]:
    """Token ids of the prompt (with the assistant's opening) and of the whole conversation."""
    try:
        chat_prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        full_text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as exc:  # a template's own errors (jinja) vary
        raise CompareRefusedError("format", _first_line(exc)) from exc
    prompt_ids = tokenizer(chat_prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    if full_ids[: len(prompt_ids)] != prompt_ids:  # a template that rewrites earlier turns: score the answer alone
        answer = str(messages[-1].get("content") or "") + (tokenizer.eos_token or "")
        full_ids = prompt_ids + tokenizer(answer, add_special_tokens=False)["input_ids"]
    return prompt_ids, full_ids


def answer_loss(model: Any, tuned: bool, prompt_ids: list[int], full_ids: list[int]) -> tuple[float, int]:
    """The summed cross-entropy over the reference tokens (after the prompt), and how many there are."""
    import torch

    ids = torch.tensor([full_ids], device=model.device)
    with torch.inference_mode(), _adapter_state(model, tuned):
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    targets = ids[0, len(prompt_ids) :]
    loss = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    return float(loss), int(targets.numel())


def _answer(model: Any, tokenizer: Any, tuned: bool, prompt_ids: list[int], max_new_tokens: int) -> str:
    """The greedy answer to the prompt, without special tokens."""
    import torch

    ids = torch.tensor([prompt_ids], device=model.device)
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


# -- the child's command line ----------------------------------------------------------------------------------------


def read_rows(path: Path) -> list[tuple[int, Messages]]:
    """The ``{"line": N, "messages": [...]}`` rows the app wrote for the child, one JSON object per line."""
    rows = []
    for text in path.read_text(encoding="utf-8").splitlines():
        if text.strip():
            row = json.loads(text)
            rows.append((int(row["line"]), list(row["messages"])))
    return rows


def print_progress(fraction: float | None, text: str) -> None:
    """Prints a ``progress FRACTION TEXT`` line for the app (``-`` for an unknown fraction)."""
    shown = "-" if fraction is None else f"{fraction:.3f}"
    print(f"progress {shown} {text}", flush=True)


def child_main(argv: list[str], work: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Runs a child's ``work`` on the JSON job in ``argv[1]`` and prints its ``result`` line (or its refusal).

    Returns:
        0 with a ``result`` line, or :data:`REFUSED_EXIT` with a ``refused KIND DETAIL`` line.
    """
    job = json.loads(argv[1])
    try:
        result = work(job)
    except CompareRefusedError as exc:
        print(f"refused {exc.kind} {exc.detail}", flush=True)
        return REFUSED_EXIT
    print("result " + json.dumps(result), flush=True)
    return 0


def main(argv: list[str]) -> int:
    """``python -m trainer_payload.compare JOB``: JOB holds ``base``, ``adapter``, ``rows``, ``max_new_tokens``."""
    return child_main(
        argv,
        lambda job: compare_rows(
            Path(job["base"]), Path(job["adapter"]), read_rows(Path(job["rows"])), int(job["max_new_tokens"]),
            print_progress,
        ),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv))
