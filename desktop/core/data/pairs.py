"""Preference pairs (DPO, ORPO) as the data check reads them: each pair's defects, and the lengths of a file's answers.

A pair is read by :func:`trainer_payload.protocol.pair_from_row`, exactly as the machine will read it, into TRL's
``prompt`` / ``chosen`` / ``rejected``. What the machine would refuse is an error here, named with its line; what it
would train on but learn badly from (the same answer on both sides, answers longer on one side throughout) is said
too, before anything is rented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from desktop.core.data.findings import Code, Finding
from desktop.core.data.rules import private_text_findings
from trainer_payload.protocol import Pair, PairError, PairProblem, pair_answer, pair_form, pair_from_row, pair_prompt

Message = dict[str, Any]

_CODES = {
    PairProblem.SHAPE: Code.PAIR_SHAPE,
    PairProblem.MISSING: Code.MISSING_SIDE,
    PairProblem.EMPTY: Code.EMPTY_CONTENT,
    PairProblem.PROMPT_DIFFERS: Code.PROMPT_DIFFERS,
}


def side_conversation(pair: Pair, side: str) -> list[Message]:
    """The prompt and one answer (``chosen`` or ``rejected``) as one conversation, as the model reads it."""
    return pair_prompt(pair) + pair_answer(pair, side)


def answer_only(pair: Pair, side: str) -> list[Message]:
    """One side's answer alone, for measuring its length."""
    return pair_answer(pair, side)


def pair_messages(pair: Pair) -> list[Message]:
    """Every message of a pair once (prompt, chosen, rejected): for duplicates and the secret scan."""
    return side_conversation(pair, "chosen") + answer_only(pair, "rejected")


def pair_preview(pair: Pair) -> list[Message]:
    """A pair as the data step previews it: the prompt's messages, then each answer under its side's name."""
    prompt = pair_prompt(pair)
    answers = [
        {"role": side, "content": "\n".join(str(m.get("content") or "") for m in answer_only(pair, side))}
        for side in ("chosen", "rejected")
    ]
    return prompt + answers


def check_pair(row: Any, line: int, form: str | None) -> tuple[Pair | None, list[Finding]]:
    """One row's pair and what is wrong with it; ``form`` is the file's (its first pair's), None before any.

    Returns:
        The pair (None when it cannot train) and the findings (errors make it unusable).
    """
    try:
        pair = pair_from_row(row)
    except PairError as exc:
        return None, [Finding(_CODES[exc.problem], line, str(exc))]
    if form is not None and pair_form(pair) != form:
        return None, [Finding(Code.PAIR_SHAPE, line, f"this pair is {pair_form(pair)}, the file's first is {form}")]
    findings = list(private_text_findings(pair_messages(pair), line))
    if pair["chosen"] == pair["rejected"]:
        findings.append(Finding(Code.SAME_ANSWERS, line))
    return pair, findings


#: A share of pairs with the longer answer on the chosen side above which DPO learns "longer is better".
BIASED_SHARE = 0.7
#: Fewer pairs than this say nothing about a bias.
BIAS_MIN_PAIRS = 20


@dataclass
class LengthBias:
    """How the chosen answers' lengths compare with the rejected ones' over a file (tokens of the answers alone)."""

    pairs: int = 0
    chosen_longer: int = 0
    rejected_longer: int = 0
    chosen_tokens: int = 0
    rejected_tokens: int = 0

    def add(self, chosen: int, rejected: int) -> None:
        """Counts one pair's answer lengths."""
        self.pairs += 1
        self.chosen_longer += chosen > rejected
        self.rejected_longer += rejected > chosen
        self.chosen_tokens += chosen
        self.rejected_tokens += rejected

    def note(self) -> str:
        """A sentence when one side is longer in most pairs ("" otherwise, or with too few pairs to tell)."""
        if self.pairs < BIAS_MIN_PAIRS:
            return ""
        for longer, count, tokens, other in (
            ("chosen", self.chosen_longer, self.chosen_tokens, self.rejected_tokens),
            ("rejected", self.rejected_longer, self.rejected_tokens, self.chosen_tokens),
        ):
            if count / self.pairs >= BIASED_SHARE:
                times = tokens / max(1, other)
                return (
                    f"length bias: the {longer} answer is the longer one in {count / self.pairs:.0%} of "
                    f"{self.pairs:,} pairs ({times:.1f}x as many tokens in all); DPO learns the length along with "
                    "the preference: balance the lengths, or pair answers of similar length"
                )
        return ""
