"""Cold start: launch to first window shown, against a bare PySide6 window started the same way."""

from __future__ import annotations

from desktop import __version__
from tests.benchmarks.common import PYTHON, Row, median_interleaved, print_table
from trainer_payload.protocol import PROTOCOL_VERSION

BARE_WINDOW = """
import sys
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication(sys.argv[:1])
window = QMainWindow()
window.resize(1280, 800)
window.show()
while not (window.windowHandle() and window.windowHandle().isExposed()):
    app.processEvents()
app.processEvents()
print("first-window", flush=True)
"""

RUNS = 7
TARGET_S = 1.5


def run() -> bool:
    env = {"QT_QPA_PLATFORM": "offscreen"}
    medians = median_interleaved(
        {
            "rentune": [PYTHON, "-m", "desktop", "--startup-probe"],
            "bare": [PYTHON, "-c", BARE_WINDOW],
            "python": [PYTHON, "-c", "print('first-window')"],
        },
        "first-window",
        RUNS,
        env,
    )
    version_line = f"rentune {__version__} (payload protocol {PROTOCOL_VERSION})"
    cli = median_interleaved({"version": [PYTHON, "-m", "desktop", "--version"]}, version_line, RUNS, env)
    print(f"median of {RUNS} interleaved cold starts (offscreen); bare Python start: {medians['python']:.3f} s")
    return print_table(
        [
            Row(
                "cold start to first window",
                medians["rentune"],
                medians["bare"],
                "s",
                f"< {TARGET_S} s",
                medians["rentune"] < TARGET_S,
            ),
            Row(
                "rentune --version (CLI start)", cli["version"], medians["python"], "s", "< 0.3 s", cli["version"] < 0.3
            ),
        ]
    )
