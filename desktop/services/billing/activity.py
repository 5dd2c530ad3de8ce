"""When a run's machine last did useful work that is not a trainer event: bytes of a transfer moving.

The idle guard (which terminates a rented machine that does nothing) and the meter's idle notice read it beside the
run's events and state changes, so an upload, a model download or a checkpoint or adapter pull that takes longer than
``idle_minutes`` is work, not idleness. The time is this computer's clock, kept in a small file in the run folder
(``.activity``) so every process following the run sees it; writes are throttled.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path

ACTIVITY_FILE = ".activity"
#: Seconds between two writes of the file (a transfer reports many times a second).
WRITE_EVERY_S = 5.0


def mark_activity(folder: Path, now: float | None = None) -> None:
    """Notes that the run's machine works now (bytes moved); cheap enough to call on every progress callback."""
    now = time.time() if now is None else now
    path = folder / ACTIVITY_FILE
    with contextlib.suppress(OSError):
        if now - path.stat().st_mtime < WRITE_EVERY_S:
            return
    with contextlib.suppress(OSError):  # a folder being deleted: nothing to guard any more
        path.touch()
        os.utime(path, (now, now))


def last_activity(folder: Path) -> float | None:
    """When the run's machine last moved bytes (None when it never did, as far as this computer saw)."""
    try:
        moment = (folder / ACTIVITY_FILE).stat().st_mtime
    except OSError:
        return None
    return moment if math.isfinite(moment) else None
