"""``rentune --screenshot FILE --page NAME`` renders every page, non-blank, at 1280x800 and at 200 % scaling, in light
and in dark (and the dark renders are dark), without changing what the user saved."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage

from desktop.core.runs.draft import RunDraft
from desktop.services.runs.drafts import draft_path, load_draft, save_draft
from desktop.services.runs.store import RunStore
from desktop.ui.pages.catalog import page_names
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


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("scale", ["1", "2"])
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_non_blank_in_both_themes(tmp_path: Path, page: str, scale: str, theme: str) -> None:
    record_finished_run(RunStore())  # the monitor and the runs list show a recorded run
    if page == "costs":
        seed_spending()  # months of rentals, a run training now, a machine left billing
    out = tmp_path / f"{page}.png"
    result = rentune("--screenshot", str(out), "--page", page, "--scale", scale, "--theme", theme)
    assert result.returncode == 0, result.stderr
    image = _non_blank(out)
    factor = int(scale)
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
