"""The bundled app (make dist): its size and its cold start to the first window, against the app run from source.

Builds ``dist/rentune`` first when it is missing or older than the sources (as the bundle tests do). Starts are
offscreen, each with a fresh profile, interleaved with ``python -m desktop`` from the test venv. Target: the bundle's
first window in under 2 s.
"""

from __future__ import annotations

import tempfile

from tests.benchmarks.bench_startup import BARE_WINDOW
from tests.benchmarks.common import PYTHON, Row, median_interleaved, print_table
from tests.installers.test_bundle import BUNDLE, build_bundle, bundle_is_current

RUNS = 7
TARGET_S = 2.0


def run() -> bool:
    if not bundle_is_current():
        build_bundle()
    program = BUNDLE / "rentune"
    size = sum(path.stat().st_size for path in BUNDLE.rglob("*") if path.is_file() and not path.is_symlink())
    packages = sorted(BUNDLE.parent.glob("rentune*.tar.gz")) + sorted(BUNDLE.parent.glob("rentune*.deb"))
    with tempfile.TemporaryDirectory() as home:
        env = {"QT_QPA_PLATFORM": "offscreen", "RENTUNE_HOME": home}
        medians = median_interleaved(
            {
                "bundle": [str(program), "--startup-probe"],
                "source": [PYTHON, "-m", "desktop", "--startup-probe"],
                "bare": [PYTHON, "-c", BARE_WINDOW],
            },
            "first-window",
            RUNS,
            env,
        )
    print(f"median of {RUNS} interleaved cold starts (offscreen); bundle {size / 1e6:.0f} MB in {BUNDLE}")
    for package in packages:
        print(f"  {package.name}: {package.stat().st_size / 1e6:.0f} MB")
    return print_table(
        [
            Row(
                "bundle: cold start to first window",
                medians["bundle"],
                medians["source"],
                "s",
                f"< {TARGET_S:.0f} s",
                medians["bundle"] < TARGET_S,
            ),
            Row("bundle: size on disk (MB)", size / 1e6, None, "MB", "reported", True),
            Row("bare PySide6 window (for scale)", medians["bare"], medians["source"], "s", "reported", True),
        ]
    )
