"""A table column drawn as coloured badges: the cell's text in a pill coloured by its severity (in words and colour)."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

from desktop.ui.theme import current_palette

#: The item data role holding a cell's severity (``success``, ``warning``, ``danger``, ``info``).
SEVERITY_ROLE = Qt.ItemDataRole.UserRole + 1
_PAD_X, _PAD_Y = 8, 3


class BadgeDelegate(QStyledItemDelegate):
    """Paints each cell of its column as a :class:`~desktop.ui.widgets.blocks.Badge` looks, from the palette."""

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        """Draws the row's background (selection included), then the pill."""
        style = option.widget.style() if option.widget is not None else None
        background = QStyleOptionViewItem(option)
        self.initStyleOption(background, index)
        background.text = ""
        if style is not None:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, background, painter, option.widget)
        text = str(index.data(Qt.ItemDataRole.DisplayRole) or "")
        if not text:
            return
        foreground, fill = current_palette().severity(str(index.data(SEVERITY_ROLE) or "info"))
        metrics = option.fontMetrics
        width = min(metrics.horizontalAdvance(text) + 2 * _PAD_X, option.rect.width() - 4)
        height = metrics.height() + 2 * _PAD_Y
        rect = QRectF(option.rect.x() + 4, option.rect.center().y() - height / 2 + 1, width, height)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(QColor(foreground), 1))
        painter.setBrush(QColor(fill))
        painter.drawRoundedRect(rect, height / 2, height / 2)
        font = painter.font()
        font.setBold(True)
        painter.setFont(font)
        elided = metrics.elidedText(text, Qt.TextElideMode.ElideRight, int(width) - 2 * _PAD_X + 2)
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, elided)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        """Room for the pill (its bold text and padding)."""
        text = str(index.data(Qt.ItemDataRole.DisplayRole) or "")
        metrics = option.fontMetrics
        return QSize(int(metrics.horizontalAdvance(text) * 1.1) + 2 * _PAD_X + 10, metrics.height() + 2 * _PAD_Y + 6)
