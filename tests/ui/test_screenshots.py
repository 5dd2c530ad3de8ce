"""``rentune --screenshot FILE --page NAME`` renders every page, non-blank, at 1280x800 and at 200 % scaling, in light
and in dark (and the dark renders are dark), without changing what the user saved.

Every page in both themes renders through the app's own main coroutine in this process (what ``--screenshot`` runs,
without a process start per picture); ``rentune --screenshot`` itself, and 200 % scaling (set before Qt starts),
run as the user's command for two pages.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication

from desktop.core.runs.draft import RunDraft
from desktop.core.settings import Theme
from desktop.services.runs.drafts import draft_path, load_draft, save_draft
from desktop.services.runs.store import RunStore
from desktop.ui import app as app_module
from desktop.ui.app import GuiOptions
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.catalog import page_names
from desktop.ui.theme import apply_theme, force_theme
from tests.fixtures.recorded_costs import seed_spending
from tests.fixtures.recorded_run import record_finished_run
from tests.test_cli import _non_blank, rentune

#: Every page but "new" (the wizard shows as its steps).
PAGES = [name for name in page_names() if name != "new"]


def _lightness(image: QImage) -> float:
    """The mean lightness (0 black, 1 white) of a grid of the image's pixels."""
    samples = [
        QColor(image.pixel(x, y)).lightnessF()
        for x in range(0, image.width(), 11)
        for y in range(0, image.height(), 11)
    ]
    return sum(samples) / len(samples)


def _seed(page: str) -> None:
    record_finished_run(RunStore())  # the monitor and the runs list show a recorded run
    if page == "costs":
        seed_spending()  # months of rentals, a run training now, a machine left billing


@pytest.fixture
def app_state_restored(qloop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Puts back what the app's main coroutine sets for its process: the excepthook, the theme, its window."""
    hook = sys.excepthook
    yield
    sys.excepthook = hook
    for widget in QApplication.topLevelWidgets():
        if isinstance(widget, MainWindow):
            qloop.run_until_complete(widget.context.close())  # as the app does once its window closes
            widget.close()
            widget.deleteLater()  # a window left alive would be restyled by every later test's theme
    qloop.run_until_complete(asyncio.sleep(0.05))
    force_theme(None)
    apply_theme(Theme.LIGHT)


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_non_blank_in_both_themes(
    tmp_path: Path,
    page: str,
    theme: str,
    qloop: asyncio.AbstractEventLoop,
    app_state_restored: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _seed(page)
    out = tmp_path / f"{page}.png"
    monkeypatch.setattr(app_module, "install_wheel_guard", lambda _app: None)  # one per QApplication, not per test
    options = GuiOptions(screenshot=out, page=page, theme=Theme(theme))
    assert qloop.run_until_complete(app_module.main(options)) == 0
    _assert_rendered(out, page, theme, factor=1)


@pytest.mark.parametrize(("page", "theme"), [("monitor", "dark"), ("costs", "light")])
def test_the_screenshot_command_renders_at_200_percent(tmp_path: Path, page: str, theme: str) -> None:
    _seed(page)
    out = tmp_path / f"{page}.png"
    result = rentune("--screenshot", str(out), "--page", page, "--scale", "2", "--theme", theme)
    assert result.returncode == 0, result.stderr
    _assert_rendered(out, page, theme, factor=2)


def _assert_rendered(out: Path, page: str, theme: str, *, factor: int) -> None:
    image = _non_blank(out)
    assert (image.width(), image.height()) == (1280 * factor, 800 * factor)
    lightness = _lightness(image)
    if theme == "dark":
        assert lightness < 0.3, f"the dark {page} page is not dark (mean lightness {lightness:.2f})"
    else:
        assert lightness > 0.7, f"the light {page} page is not light (mean lightness {lightness:.2f})"


def test_a_screenshot_never_changes_the_saved_wizard_step(tmp_path: Path) -> None:
    save_draft(RunDraft(base_model="qwen2.5-7b", step="model"))
    saved = draft_path().read_bytes()
    result = rentune("--screenshot", str(tmp_path / "review.png"), "--page", "review")
    assert result.returncode == 0, result.stderr
    assert draft_path().read_bytes() == saved
    assert load_draft().step == "model"
