r"""Starting Rentune at login, minimised to the menu bar or tray: one entry per platform, written or removed.

- Linux and other XDG desktops: ``$XDG_CONFIG_HOME/autostart/rentune.desktop`` (``~/.config`` by default).
- macOS: a launch agent, ``~/Library/LaunchAgents/app.rentune.Rentune.plist``, run at load (that is, at login).
- Windows: the ``Rentune`` value under ``HKCU\Software\Microsoft\Windows\CurrentVersion\Run``.

Every entry starts ``rentune --minimized`` with the interpreter (or frozen app) running now.
"""

from __future__ import annotations

import contextlib
import os
import plistlib
import subprocess
import sys
from pathlib import Path

from desktop.services.platform.files import atomic_write_bytes, atomic_write_text

#: The launch agent's label (macOS).
MAC_LABEL = "app.rentune.Rentune"
#: The value name under the Run key (Windows).
WINDOWS_VALUE = "Rentune"
WINDOWS_RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
#: The flag that opens the app minimised to the tray.
MINIMIZED_FLAG = "--minimized"
#: Characters that make an ``Exec`` argument need quotes (Desktop Entry Specification, "The Exec key").
_RESERVED = frozenset(" \t\n\"'\\><~|&;$*?#()`")


class AutostartError(OSError):
    """The login entry cannot be written or removed; the message names where and why."""


def login_command() -> list[str]:
    """The command that starts this Rentune minimised: the frozen app, or this interpreter with ``-m desktop``.

    On Windows the windowless ``pythonw.exe`` beside the interpreter is preferred (no console window at login).
    """
    if getattr(sys, "frozen", False):
        return [sys.executable, MINIMIZED_FLAG]
    python = Path(sys.executable)
    windowless = python.with_name("pythonw.exe")
    if python.name.lower() == "python.exe" and windowless.exists():
        python = windowless
    return [str(python), "-m", "desktop", MINIMIZED_FLAG]


def _platform(platform: str | None) -> str:
    name = platform or sys.platform
    if name.startswith("win"):
        return "windows"
    return "macos" if name == "darwin" else "xdg"


def entry_path(platform: str | None = None) -> Path | None:
    """The file that starts Rentune at login here (None on Windows, where it is a registry value)."""
    kind = _platform(platform)
    if kind == "windows":
        return None
    if kind == "macos":
        return Path.home() / "Library" / "LaunchAgents" / f"{MAC_LABEL}.plist"
    config = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(config) if Path(config).is_absolute() else Path.home() / ".config"  # the spec ignores relative paths
    return root / "autostart" / "rentune.desktop"


def _desktop_quote(argument: str) -> str:
    r"""An argument of a desktop entry's ``Exec`` line, quoted and escaped as the Desktop Entry spec asks.

    Field codes are escaped (``%%``); an argument with a reserved character is double-quoted with ``"`` `` ` ``
    ``$`` ``\`` escaped by a backslash, and since a string value's own escapes are undone first, every backslash
    is then doubled.
    """
    escaped = argument.replace("%", "%%")
    if not any(char in escaped for char in _RESERVED):
        return escaped
    for char in ("\\", '"', "`", "$"):
        escaped = escaped.replace(char, "\\" + char)
    return '"' + escaped.replace("\\", "\\\\") + '"'


def desktop_entry(command: list[str]) -> str:
    """The XDG autostart file that runs ``command``."""
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Name=Rentune\n"
        "Comment=What your fine-tunes cost: today, this month, and the machines billing now\n"
        f"Exec={' '.join(_desktop_quote(part) for part in command)}\n"
        "Terminal=false\n"
        "X-GNOME-Autostart-enabled=true\n"
    )


def launch_agent(command: list[str]) -> bytes:
    """The macOS launch agent (an XML property list) that runs ``command`` at login."""
    agent = {
        "Label": MAC_LABEL,
        "ProgramArguments": command,
        "RunAtLoad": True,
        "ProcessType": "Interactive",
        "LimitLoadToSessionType": "Aqua",
    }
    return plistlib.dumps(agent, fmt=plistlib.FMT_XML)


def enable_autostart(command: list[str] | None = None, *, platform: str | None = None) -> str:
    """Makes Rentune start at login (minimised); returns where the entry is.

    Raises:
        AutostartError: The entry cannot be written.
    """
    command = command or login_command()
    kind, path = _platform(platform), entry_path(platform)
    try:
        if kind == "windows":
            return _windows_write(subprocess.list2cmdline(command))
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "macos":
            atomic_write_bytes(path, launch_agent(command))
        else:
            atomic_write_text(path, desktop_entry(command))
    except AutostartError:
        raise
    except OSError as exc:
        raise AutostartError(
            f"cannot write {path or WINDOWS_RUN_KEY} ({exc.strerror or exc}); check its folder"
        ) from exc
    return str(path)


def disable_autostart(*, platform: str | None = None) -> None:
    """Stops Rentune from starting at login (nothing to do when it did not).

    Raises:
        AutostartError: The entry exists and cannot be removed.
    """
    kind, path = _platform(platform), entry_path(platform)
    try:
        if kind == "windows":
            _windows_write(None)
        elif path is not None:
            path.unlink(missing_ok=True)
    except AutostartError:
        raise
    except OSError as exc:
        raise AutostartError(f"cannot remove {path or WINDOWS_RUN_KEY} ({exc.strerror or exc})") from exc


def autostart_enabled(*, platform: str | None = None) -> bool:
    """Whether Rentune's login entry exists."""
    if _platform(platform) == "windows":
        return _windows_read() is not None
    path = entry_path(platform)
    return path is not None and path.is_file()


def set_autostart(enabled: bool, *, platform: str | None = None) -> None:
    """Writes or removes the login entry.

    Raises:
        AutostartError: The entry cannot be written or removed.
    """
    if enabled:
        enable_autostart(platform=platform)
    else:
        disable_autostart(platform=platform)


def _windows_write(value: str | None) -> str:
    """Sets (or, with None, deletes) the Run value; Windows only."""
    if sys.platform != "win32":
        raise AutostartError("the Windows login entry can only be written on Windows")
    import winreg

    with winreg.CreateKey(winreg.HKEY_CURRENT_USER, WINDOWS_RUN_KEY) as key:
        if value is not None:
            winreg.SetValueEx(key, WINDOWS_VALUE, 0, winreg.REG_SZ, value)
        else:
            with contextlib.suppress(FileNotFoundError):  # not there: nothing to remove
                winreg.DeleteValue(key, WINDOWS_VALUE)
    return f"HKEY_CURRENT_USER\\{WINDOWS_RUN_KEY}\\{WINDOWS_VALUE}"


def _windows_read() -> str | None:
    if sys.platform != "win32":
        return None
    import winreg

    try:
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, WINDOWS_RUN_KEY) as key:
            value, _kind = winreg.QueryValueEx(key, WINDOWS_VALUE)
    except FileNotFoundError:
        return None
    return str(value)
