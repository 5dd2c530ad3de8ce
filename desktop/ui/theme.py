"""Applying the light or dark look to the running app: Rentune's own palettes, following the OS unless forced.

The app ships both palettes and its stylesheet, so Dark is dark even where the desktop has no theme (X11 without
a theme, offscreen). Widgets that paint themselves (charts) read :func:`current_palette` and listen to
:data:`theme_events`.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from desktop.core.settings import Theme
from desktop.ui.design.palette import DARK, LIGHT, Palette
from desktop.ui.design.stylesheet import build_stylesheet


class ThemeEvents(QObject):
    """Announces a change of palette to widgets that draw with it."""

    sig_changed = Signal(object)


class _State:
    palette: Palette = LIGHT
    forced: Theme | None = None
    events: ThemeEvents | None = None


def theme_events() -> ThemeEvents:
    """The app's one :class:`ThemeEvents` (made on first use, after the QApplication exists)."""
    if _State.events is None:
        _State.events = ThemeEvents()
    return _State.events


def current_palette() -> Palette:
    """The palette the app is drawn in now."""
    return _State.palette


def force_theme(theme: Theme | None) -> None:
    """Makes ``theme`` win over the saved preference for this session (``rentune --theme``); None undoes it."""
    _State.forced = theme


def _wants_dark(theme: Theme) -> bool:
    hints = QGuiApplication.styleHints()
    if theme is Theme.SYSTEM:
        hints.unsetColorScheme()
        return hints.colorScheme() is Qt.ColorScheme.Dark
    hints.setColorScheme(Qt.ColorScheme.Dark if theme is Theme.DARK else Qt.ColorScheme.Light)
    return theme is Theme.DARK


def apply_theme(theme: Theme) -> Palette:
    """Draws the app light or dark: ``theme`` from the settings, unless ``rentune --theme`` forced one.

    Fusion is used outside macOS so that the palette and stylesheet look the same everywhere.

    Returns:
        The palette now in use.
    """
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        return _State.palette
    if sys.platform != "darwin" and app.style().name().lower() != "fusion":
        app.setStyle("Fusion")
    palette = DARK if _wants_dark(_State.forced or theme) else LIGHT
    _State.palette = palette
    app.setPalette(qt_palette(palette))
    app.setStyleSheet(build_stylesheet(palette))
    theme_events().sig_changed.emit(palette)
    return palette


def qt_palette(palette: Palette) -> QPalette:
    """The Qt palette for ``palette``, so that unstyled parts (menus, dialogs, native bits) match."""
    result = QPalette()
    roles = {
        QPalette.ColorRole.Window: palette.window,
        QPalette.ColorRole.WindowText: palette.text,
        QPalette.ColorRole.Base: palette.surface,
        QPalette.ColorRole.AlternateBase: palette.surface_alt,
        QPalette.ColorRole.ToolTipBase: palette.surface,
        QPalette.ColorRole.ToolTipText: palette.text,
        QPalette.ColorRole.PlaceholderText: palette.text_muted,
        QPalette.ColorRole.Text: palette.text,
        QPalette.ColorRole.Button: palette.surface,
        QPalette.ColorRole.ButtonText: palette.text,
        QPalette.ColorRole.BrightText: palette.danger,
        QPalette.ColorRole.Highlight: palette.accent,
        QPalette.ColorRole.HighlightedText: palette.accent_text,
        QPalette.ColorRole.Link: palette.accent,
        QPalette.ColorRole.Mid: palette.border,
        QPalette.ColorRole.Dark: palette.border,
        QPalette.ColorRole.Light: palette.surface_alt,
    }
    for role, color in roles.items():
        result.setColor(role, QColor(color))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        result.setColor(QPalette.ColorGroup.Disabled, role, QColor(palette.text_muted))
    # a tick box that cannot be ticked is greyed (light) or sunk into the window (dark), not filled like one that can
    disabled_box = palette.window if palette.is_dark else palette.surface_alt
    result.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Base, QColor(disabled_box))
    return result
