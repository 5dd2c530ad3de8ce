"""``rentune --screenshot FILE --page NAME`` renders every page, non-blank, at 1280x800 and at 200 % scaling."""

from __future__ import annotations

from pathlib import Path

import pytest

from desktop.services.runs.store import RunStore
from tests.fixtures.recorded_costs import seed_spending
from tests.fixtures.recorded_run import record_finished_run
from tests.test_cli import _non_blank, rentune

PAGES = ["data", "model", "sizing", "compute", "review", "monitor", "runs", "models", "chat", "costs", "settings"]


@pytest.mark.parametrize("scale", ["1", "2"])
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_non_blank(tmp_path: Path, page: str, scale: str) -> None:
    record_finished_run(RunStore())  # the monitor and the runs list show a recorded run
    if page == "costs":
        seed_spending()  # months of rentals, a run training now, a machine left billing
    out = tmp_path / f"{page}.png"
    result = rentune("--screenshot", str(out), "--page", page, "--scale", scale)
    assert result.returncode == 0, result.stderr
    image = _non_blank(out)
    factor = int(scale)
    assert (image.width(), image.height()) == (1280 * factor, 800 * factor)
