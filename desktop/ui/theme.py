"""Applying the light/dark preference to the running app."""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from desktop.core.settings import Theme


def apply_theme(theme: Theme) -> None:
    """Follows the OS colour scheme, or forces light or dark.

    Fusion is used outside macOS because it honours the colour scheme everywhere; macOS keeps its native style.
    """
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        return
    if sys.platform != "darwin" and app.style().name().lower() != "fusion":
        app.setStyle("Fusion")
    hints = QGuiApplication.styleHints()
    if theme is Theme.SYSTEM:
        hints.unsetColorScheme()
    else:
        hints.setColorScheme(Qt.ColorScheme.Dark if theme is Theme.DARK else Qt.ColorScheme.Light)
