"""Applying the light/dark preference to the running app."""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
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
    # Where the platform has no colour-scheme support (X11 without a desktop theme, offscreen), the hint alone
    # changes nothing: the palette is set explicitly too.
    dark = theme is Theme.DARK or (theme is Theme.SYSTEM and hints.colorScheme() is Qt.ColorScheme.Dark)
    app.setPalette(dark_palette() if dark else app.style().standardPalette())


def dark_palette() -> QPalette:
    """Fusion's colours for a dark window: light text on dark greys, the same blue for selections and links."""
    palette = QPalette()
    colors = {
        QPalette.ColorRole.Window: "#2b2b2e",
        QPalette.ColorRole.WindowText: "#e6e6e6",
        QPalette.ColorRole.Base: "#1f1f22",
        QPalette.ColorRole.AlternateBase: "#29292d",
        QPalette.ColorRole.ToolTipBase: "#2b2b2e",
        QPalette.ColorRole.ToolTipText: "#e6e6e6",
        QPalette.ColorRole.PlaceholderText: "#8c8c92",
        QPalette.ColorRole.Text: "#e6e6e6",
        QPalette.ColorRole.Button: "#35353a",
        QPalette.ColorRole.ButtonText: "#e6e6e6",
        QPalette.ColorRole.BrightText: "#ff6b6b",
        QPalette.ColorRole.Highlight: "#3d8ee6",
        QPalette.ColorRole.HighlightedText: "#ffffff",
        QPalette.ColorRole.Link: "#6cb1ff",
        QPalette.ColorRole.Mid: "#3f3f45",
        QPalette.ColorRole.Dark: "#18181b",
        QPalette.ColorRole.Light: "#4a4a50",
    }
    for role, color in colors.items():
        palette.setColor(role, QColor(color))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#7a7a80"))
    return palette
