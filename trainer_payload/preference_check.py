"""Preference check, base against tuned: on held-out pairs, which answer does each model find the likelier?

``python -m trainer_payload.preference_check JOB`` (a child of the app): JOB is JSON with ``base``, ``adapter`` and
``pairs`` (a file of ``{"line": N, "pair": {...}}`` rows, each pair as :func:`trainer_payload.protocol.pair_from_row`
reads it). The base loads once with the adapter on top; each pair's two answers are scored with the adapter on
(tuned) and off (base) as the mean log-probability per answer token, after the prompt.

Per token, because the answers of a pair differ in length: summed, the shorter answer is the likelier whatever the
model learned. DPO itself compares summed log-probabilities against its reference, which cancels the length; a
model on its own has no reference, so the check compares per token.

Prints ``progress FRACTION TEXT`` lines, then ``result JSON``: each pair's line and, per model, the chosen and
rejected answers' mean log-probability. A base or adapter that does not load is a ``refused KIND DETAIL`` line, as
in :mod:`trainer_payload.compare`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from trainer_payload.compare import (
    Say,
    answer_loss,
    child_main,
    load_tuned,
    print_progress,
    token_ids,
)
from trainer_payload.protocol import Pair, pair_answer, pair_prompt

SIDES = ("chosen", "rejected")


def read_pairs(path: Path) -> list[tuple[int, Pair]]:
    """The ``{"line": N, "pair": {...}}`` rows the app wrote for the child."""
    rows = []
    for text in path.read_text(encoding="utf-8").splitlines():
        if text.strip():
            row = json.loads(text)
            rows.append((int(row["line"]), dict(row["pair"])))
    return rows


def answer_logprob(model: Any, tokenizer: Any, tuned: bool, pair: Pair, side: str) -> float:
    """The mean log-probability per token of one side's answer after the pair's prompt."""
    prompt = pair_prompt(pair)
    prompt_ids, full_ids = token_ids(tokenizer, prompt, prompt + pair_answer(pair, side))
    loss, tokens = answer_loss(model, tuned, prompt_ids, full_ids)
    return -loss / max(1, tokens)


def score_pairs(base: Path, adapter: Path, pairs: list[tuple[int, Pair]], say: Say) -> dict[str, Any]:
    """Each pair's answers scored by the tuned model and by the base.

    Raises:
        CompareRefusedError: The base or the adapter does not load, or the chat template fails on a pair.
    """
    say(0.0, "loading the base model and the adapter")
    model, tokenizer = load_tuned(base, adapter)
    scored = []
    for index, (line, pair) in enumerate(pairs):
        say(index / len(pairs), f"pair {index + 1} of {len(pairs)}")
        row: dict[str, Any] = {"line": line}
        for which, tuned in (("tuned", True), ("base", False)):
            row[which] = [answer_logprob(model, tokenizer, tuned, pair, side) for side in SIDES]
        scored.append(row)
    say(1.0, "pairs scored")
    return {"pairs": scored}


def main(argv: list[str]) -> int:
    """``python -m trainer_payload.preference_check JOB``; JOB is JSON with ``base``, ``adapter`` and ``pairs``."""
    return child_main(
        argv,
        lambda job: score_pairs(
            Path(job["base"]), Path(job["adapter"]), read_pairs(Path(job["pairs"])), print_progress
        ),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv))
