"""What judging on the rented machine costs: its minutes of loading and answering, and their price.

Judging on the machine (``[judge] on_machine``) loads the base and the adapter once, then answers each held-out row
twice (base, tuned), greedily, one token at a time, batch 1. A token then costs either the per-token overhead of
``transformers``' ``generate`` (small models) or one read of the 16-bit weights from GPU memory (large ones); the
estimate takes every answer at its full length, so it is an upper bound (most answers end sooner).
"""

from __future__ import annotations

from desktop.core.export.on_machine import MACHINE_BYTES_PER_S, OnMachineCost

#: Minutes before the first answer beyond reading the weights: starting Python, importing torch, placing the model.
JUDGE_FIXED_MINUTES = 1.5
#: Seconds per generated token that ``generate`` spends at batch 1 however small the model (Python and kernel launches).
SECONDS_PER_TOKEN_FLOOR = 0.025
#: GPU memory read per second while generating (bytes): a data-centre GPU's bandwidth, as ``generate`` achieves it.
GPU_READ_BYTES_PER_S = 1.0e12


def judge_cost(params: int, rows: int, max_new_tokens: int, price_per_hour: float | None) -> OnMachineCost:
    """The machine's paid minutes (at most) for judging ``rows`` held-out rows of a ``params`` model, and their price.

    The answers are a few kilobytes: their download is counted as nothing.
    """
    weights = params * 2
    per_token = max(SECONDS_PER_TOKEN_FLOOR, weights / GPU_READ_BYTES_PER_S)
    answering = rows * 2 * max_new_tokens * per_token / 60
    work = JUDGE_FIXED_MINUTES + weights / MACHINE_BYTES_PER_S / 60 + answering
    usd = round(work / 60 * price_per_hour, 2) if price_per_hour else None
    return OnMachineCost(round(work, 1), 0.0, usd)
