"""Runs a module as ``python -m`` would and writes the process's peak memory when it ends.

``python -m desktop.services.trial.peak_memory OUT MODULE ARGS...``: the trial's trainer runs in this process, so its
peak resident memory is this process's; it is written to OUT (a JSON number of GB, or null where the platform does
not say) however the module ends.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def peak_gb() -> float | None:
    """This process's peak resident memory in GB (None on Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9  # bytes on macOS, KiB elsewhere


def main(argv: list[str]) -> None:
    """Runs ``argv[1]`` as ``__main__`` with ``argv[2:]`` as its arguments; writes the peak to ``argv[0]``."""
    out, module, arguments = Path(argv[0]), argv[1], argv[2:]
    sys.argv = [module, *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        out.write_text(json.dumps(peak_gb()), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
