"""The ``rentune`` command: version, doctor, screenshots and clear errors, run as a user would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from desktop import __version__
from desktop.cli import main


def rentune(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = os.environ | (env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "desktop", *args], check=False, capture_output=True, text=True, env=env, timeout=120
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"rentune {__version__}")


def test_doctor_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)
    assert {"Python", "Keyring", "Data folder", "transformers", "pyarrow"} <= {c["name"] for c in checks}


@pytest.mark.parametrize("bad", [["--size", "big"], ["--scale", "9"], ["nonsense"]])
def test_bad_arguments_exit_2_with_a_message(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(bad)
    assert exited.value.code == 2
    assert "rentune: error:" in capsys.readouterr().err


def _non_blank(path: Path) -> QImage:
    image = QImage(str(path))
    assert not image.isNull()
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    assert len(colours) > 20, "the screenshot looks blank"
    return image


@pytest.mark.parametrize(("page", "scale", "size"), [(None, "1", (1280, 800)), ("settings", "2", (2560, 1600))])
def test_screenshot_renders_a_non_blank_png(
    tmp_path: Path, page: str | None, scale: str, size: tuple[int, int]
) -> None:
    out = tmp_path / "shot.png"
    result = rentune("--screenshot", str(out), "--scale", scale, *(["--page", page] if page else []))
    assert result.returncode == 0, result.stderr
    image = _non_blank(out)
    assert (image.width(), image.height()) == size


def test_screenshot_of_an_unknown_page_is_a_clear_error(tmp_path: Path) -> None:
    result = rentune("--screenshot", str(tmp_path / "x.png"), "--page", "nope")
    assert result.returncode == 2
    assert (
        "no page named 'nope'; choose one of: home, new, runs, models, chat, costs, settings, monitor, data, model, "
        "sizing, compute, review" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_headless_commands_do_not_load_qt_or_torch() -> None:
    probe = (
        "import sys, desktop.cli.doctor, desktop.cli.plan, desktop.cli.data, desktop.cli.runs; "
        "print(sorted(m for m in ('PySide6', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_importing_every_module_writes_nothing(rentune_home: Path) -> None:
    probe = (
        "import pkgutil, importlib, desktop, trainer_payload\n"
        "for pkg in (desktop, trainer_payload):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, env=os.environ | {"QT_QPA_PLATFORM": "offscreen"})
    assert not rentune_home.exists()


def test_gui_without_a_display_explains_instead_of_crashing() -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"}}
    result = subprocess.run(
        [sys.executable, "-m", "desktop"], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2
    assert "no display found" in result.stderr and "--screenshot" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_detach_while_serving_says_the_address_is_gone_and_how_to_get_it_back(rentune_home: Path) -> None:
    from desktop.cli.runs import _left_running
    from desktop.core.runs.states import FLOW, RunState
    from desktop.services.runs.store import RunStore

    store = RunStore()
    run_id = store.create({"serve": {"idle_minutes": 15.0}}, "ssh://me@gpu:22").id
    assert _left_running(store.get(run_id)) == f"training goes on on the machine; rentune resume {run_id} reattaches"
    for state in FLOW[FLOW.index(RunState.CONNECTING) : FLOW.index(RunState.SERVING) + 1]:
        store.transition(run_id, state)
    words = _left_running(store.get(run_id))
    assert "its address here is gone; serving ends after 15 min without a request" in words
    assert words.endswith(f"rentune resume {run_id} forwards the address again")
