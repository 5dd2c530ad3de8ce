"""Reading preference pairs (prompt, chosen answer, rejected answer) for DPO and ORPO on the GPU machine.

Each row is read by :func:`trainer_payload.protocol.pair_from_row`, as the app's data check reads it, into TRL's
``prompt`` / ``chosen`` / ``rejected``. A row that cannot train (a side missing, an answer empty, two conversations
differing before their answers) is a ``data`` error naming its line, before any step is paid for.
"""

from __future__ import annotations

from pathlib import Path

from trainer_payload.dataset import jsonl_rows
from trainer_payload.failures import DataError
from trainer_payload.protocol import Pair, PairError, pair_form, pair_from_row


def load_pairs(path: Path) -> list[Pair]:
    """Reads every pair of a preference JSONL file.

    Raises:
        DataError: The file is missing or empty, or a row is not a usable pair (named with its line).
    """
    pairs: list[Pair] = []
    for number, row in jsonl_rows(path):
        try:
            pair = pair_from_row(row)
        except PairError as exc:
            raise DataError(f"{path.name}:{number}: {exc}") from None
        if pairs and pair_form(pair) != pair_form(pairs[0]):
            raise DataError(
                f"{path.name}:{number}: this pair is {pair_form(pair)} while the first is "
                f"{pair_form(pairs[0])}: give every pair in one form"
            )
        pairs.append(pair)
    if not pairs:
        raise DataError(f"{path.name} holds no pairs")
    return pairs
