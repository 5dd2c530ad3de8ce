"""Files the machine names land inside the run's folder on this computer, or nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from desktop.services.machines.failures import PermanentError
from desktop.services.runs.checkpoints import inside as _inside


def test_plain_names_stay_inside(tmp_path: Path) -> None:
    assert _inside(tmp_path, "checkpoints") == tmp_path / "checkpoints"
    assert _inside(tmp_path / "adapter", "sub/adapter_config.json") == tmp_path / "adapter" / "sub/adapter_config.json"


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/passwd", "a\\..\\x", "C:x"])
def test_names_that_climb_out_are_refused_in_words(tmp_path: Path, name: str) -> None:
    with pytest.raises(PermanentError, match=r"^the machine sent an unsafe path: "):
        _inside(tmp_path, name)


def test_a_link_on_this_computer_that_leads_out_is_not_followed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (run / "checkpoints" / "checkpoint-10").symlink_to(tmp_path / "outside")
    with pytest.raises(PermanentError, match=r"leads out of .* through a link"):
        _inside(run, "checkpoints/checkpoint-10/adapter_model.safetensors")
    (run / "inner").mkdir()
    (run / "checkpoints" / "here").symlink_to(run / "inner")
    assert _inside(run, "checkpoints/here/x") == run / "checkpoints/here/x", "a link that stays inside is fine"
