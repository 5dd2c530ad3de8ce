"""Rendering a widget to a PNG file, for docs and for checks."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QWidget


class ScreenshotError(OSError):
    """The screenshot could not be written."""


def save_screenshot(widget: QWidget, path: Path) -> Path:
    """Renders ``widget`` with its children (offscreen works too) and saves it as PNG.

    Raises:
        ScreenshotError: The file could not be written; the message names it.
    """
    path = path.expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not widget.grab().save(str(path), "PNG"):
        raise ScreenshotError(f"could not write the screenshot to {path}; check the folder is writable")
    return path
