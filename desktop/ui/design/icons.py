"""Icons from one open-licence set (Lucide, ISC licence, ``resources/icons/lucide``), tinted to the theme.

The SVGs are drawn at the screen's device pixel ratio, so they stay crisp at 200 %.
"""

from __future__ import annotations

from functools import cache

from PySide6.QtCore import QByteArray, QRectF, QSize, Qt
from PySide6.QtGui import QGuiApplication, QIcon, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from desktop.services.platform.resources import ResourceNotFoundError, resource_bytes


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
