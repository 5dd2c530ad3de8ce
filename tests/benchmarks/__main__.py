"""Runs every benchmark module in this folder and prints their tables.

Usage: ``python -m tests.benchmarks [NAME ...]`` where NAME is a module such as ``bench_startup``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    names = argv or sorted(
        m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_")
    )
    failed = []
    for name in names:
        module = importlib.import_module(f"tests.benchmarks.{name}")
        print(f"\n== {name}: {module.__doc__.strip().splitlines()[0]}")
        if not module.run():
            failed.append(name)
    if failed:
        print(f"\nTargets missed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
