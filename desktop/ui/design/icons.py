"""Icons from one open-licence set (Lucide, ISC licence, ``resources/icons/lucide``), tinted to the theme.

The SVGs are drawn at the screen's device pixel ratio, so they stay crisp at 200 %. An icon on a widget is set with
:func:`tint`, which draws it again in the new palette's colours whenever the theme changes while the app runs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QObject, QRectF, QSize, Qt
from PySide6.QtGui import QAction, QGuiApplication, QIcon, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QAbstractButton, QLabel

from desktop.services.platform.resources import ResourceNotFoundError, resource_bytes

if TYPE_CHECKING:
    from desktop.ui.design.palette import Palette

#: An icon's colour by meaning: a field of :class:`~desktop.ui.design.palette.Palette` (``"text"``, ``"danger"``), or
#: a function of the palette (a severity's foreground), so that it follows the theme.
IconColor = str | Callable[["Palette"], str]


@cache
def _svg(name: str) -> bytes:
    try:
        return resource_bytes("icons", "lucide", f"{name}.svg")
    except ResourceNotFoundError:
        return b""


def _pixmap(name: str, color: str, size: int, ratio: float) -> QPixmap:
    pixmap = QPixmap(QSize(round(size * ratio), round(size * ratio)))
    pixmap.fill(Qt.GlobalColor.transparent)
    svg = _svg(name).replace(b"currentColor", color.encode())
    renderer = QSvgRenderer(QByteArray(svg))
    painter = QPainter(pixmap)
    renderer.render(painter, QRectF(0, 0, pixmap.width(), pixmap.height()))
    painter.end()
    pixmap.setDevicePixelRatio(ratio)
    return pixmap


def icon(name: str, color: str | None = None, size: int = 18) -> QIcon:
    """Returns the Lucide icon ``name`` (e.g. ``"play"``) drawn in ``color`` (the theme's text colour by default).

    An unknown name gives an empty icon: a missing picture never breaks a page.
    """
    from desktop.ui.theme import current_palette  # the theme module imports this one

    if not _svg(name):
        return QIcon()
    app = QGuiApplication.instance()
    ratio = app.devicePixelRatio() if isinstance(app, QGuiApplication) else 1.0
    result = QIcon()
    for scale in {1.0, ratio, 2.0}:
        result.addPixmap(_pixmap(name, color or current_palette().text, size, scale))
    return result


def palette_color(color: IconColor, palette: Palette) -> str:
    """The colour ``color`` means in ``palette``."""
    return color(palette) if callable(color) else str(getattr(palette, color))


class IconTint(QObject):
    """Keeps the icon of a button, action or label (its picture) drawn in the theme's colours.

    It is a child of its target, so it goes with it; :func:`tint` makes or updates it.
    """

    def __init__(self, target: QObject, name: str, color: IconColor, size: int) -> None:
        super().__init__(target)
        from desktop.ui.theme import theme_events  # the theme module imports this one

        self.show(name, color, size)
        theme_events().sig_changed.connect(self.on_theme_changed)

    def show(self, name: str, color: IconColor, size: int) -> None:
        """Draws ``name`` in ``color`` on the target now, and again at every change of theme."""
        self.name, self.color, self.size = name, color, size
        from desktop.ui.theme import current_palette

        self.on_theme_changed(current_palette())

    def on_theme_changed(self, palette: Palette) -> None:
        """Redraws the icon in ``palette``'s colours."""
        target = self.parent()
        drawn = icon(self.name, palette_color(self.color, palette), self.size)
        if isinstance(target, QLabel):
            target.setPixmap(drawn.pixmap(self.size, self.size))
        elif isinstance(target, (QAbstractButton, QAction)):
            target.setIcon(drawn)


def tint(target: QAbstractButton | QAction | QLabel, name: str, color: IconColor = "text", size: int = 18) -> None:
    """Gives ``target`` the icon ``name`` in ``color`` (a label shows it as its picture), kept in the theme's colours.

    Calling it again on the same target changes its icon.
    """
    existing = target.findChild(IconTint, options=Qt.FindChildOption.FindDirectChildrenOnly)
    if isinstance(existing, IconTint):
        existing.show(name, color, size)
    else:
        IconTint(target, name, color, size)
