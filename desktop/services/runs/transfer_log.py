"""When checkpoints were being brought home: a small log in the run's folder, for the bill's phases.

Each pull of a checkpoint appends one JSON line ``{"start": T0, "end": T1}`` (this computer's clock) to
``transfers.jsonl``; the bill reads the spans back (:func:`desktop.core.runs.bill_phases.split_bill`). The file is
this computer's own; a line it cannot read is skipped.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

TRANSFERS_FILE = "transfers.jsonl"


def record_transfer(folder: Path, start: float, end: float) -> None:
    """Appends one transfer span (a folder being deleted records nothing)."""
    with contextlib.suppress(OSError), (folder / TRANSFERS_FILE).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"start": start, "end": end}) + "\n")


def read_transfers(folder: Path) -> list[tuple[float, float]]:
    """The transfer spans recorded for the run, oldest first (blocking)."""
    try:
        lines = (folder / TRANSFERS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    spans = []
    for line in lines:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            row = json.loads(line)
            start, end = float(row["start"]), float(row["end"])
            if math.isfinite(start) and math.isfinite(end) and end > start:
                spans.append((start, end))
    return sorted(spans)
