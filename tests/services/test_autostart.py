"""Starting at login: the XDG autostart file for real, the macOS launch agent's content, the Windows Run value."""

from __future__ import annotations

import configparser
import plistlib
import shlex
import sys
from pathlib import Path

import pytest

from desktop.services.platform import autostart
from desktop.services.platform.autostart import (
    AutostartError,
    autostart_enabled,
    desktop_entry,
    disable_autostart,
    enable_autostart,
    entry_path,
    launch_agent,
    login_command,
    set_autostart,
)


@pytest.fixture
def xdg_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "xdg-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    return config


def _exec_line(path: Path) -> list[str]:
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # type: ignore[assignment,method-assign]
    entry.read(path)
    section = entry["Desktop Entry"]
    assert section["Type"] == "Application" and section["Name"] == "Rentune"
    return shlex.split(section["Exec"].replace("%%", "%"))


def test_the_xdg_autostart_file_appears_and_disappears(xdg_config: Path) -> None:
    path = xdg_config / "autostart" / "rentune.desktop"
    assert entry_path("linux") == path and not autostart_enabled(platform="linux")
    assert enable_autostart(platform="linux") == str(path)
    assert path.is_file() and autostart_enabled(platform="linux")
    assert _exec_line(path) == [sys.executable, "-m", "desktop", "--minimized"]
    set_autostart(False, platform="linux")
    assert not path.exists() and not autostart_enabled(platform="linux")
    disable_autostart(platform="linux")  # removing what is not there is fine


def test_a_relative_xdg_config_home_is_ignored_as_the_spec_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/config")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert entry_path("linux") == tmp_path / ".config" / "autostart" / "rentune.desktop"


def test_exec_arguments_with_spaces_and_quotes_survive(xdg_config: Path) -> None:
    command = ["/opt/My Apps/python3", "-m", "desktop", 'say "hi" $HOME 100%', "--minimized"]
    path = Path(enable_autostart(command, platform="linux"))
    line = next(line for line in path.read_text().splitlines() if line.startswith("Exec="))
    assert line == r'Exec="/opt/My Apps/python3" -m desktop "say \\"hi\\" \\$HOME 100%%" --minimized'
    assert "Exec=" + " ".join(autostart._desktop_quote(part) for part in command) in desktop_entry(command)


def test_an_unwritable_config_folder_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    with pytest.raises(AutostartError, match="cannot write"):
        enable_autostart(platform="linux")


def test_the_macos_launch_agent_runs_rentune_minimised_at_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "Library" / "LaunchAgents" / "app.rentune.Rentune.plist"
    assert enable_autostart(
        ["/Applications/Rentune.app/Contents/MacOS/Rentune", "--minimized"], platform="darwin"
    ) == str(path)
    agent = plistlib.loads(path.read_bytes())
    assert agent == {
        "Label": "app.rentune.Rentune",
        "ProgramArguments": ["/Applications/Rentune.app/Contents/MacOS/Rentune", "--minimized"],
        "RunAtLoad": True,
        "ProcessType": "Interactive",
        "LimitLoadToSessionType": "Aqua",
    }
    assert plistlib.loads(launch_agent(login_command()))["ProgramArguments"][-1] == "--minimized"
    assert autostart_enabled(platform="darwin")
    disable_autostart(platform="darwin")
    assert not path.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="on Windows the real registry value is tested below")
def test_the_windows_entry_is_refused_off_windows() -> None:
    assert entry_path("win32") is None
    with pytest.raises(AutostartError, match="only be written on Windows"):
        enable_autostart(platform="win32")
    assert not autostart_enabled(platform="win32")


@pytest.mark.skipif(sys.platform != "win32", reason="the Run key exists only on Windows")
def test_the_windows_run_value_appears_and_disappears() -> None:
    enable_autostart()
    assert autostart_enabled()
    disable_autostart()
    assert not autostart_enabled()
