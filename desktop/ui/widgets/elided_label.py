"""A one-line label that shortens its text with "…" when the space is too narrow, and shows all of it as a tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QMouseEvent, QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QStyle, QStyleOptionFrame, QWidget


class ElidedLabel(QLabel):
    """A :class:`QLabel` for one line of changing text (a status bar's) that never pushes its window wider.

    ``text()`` stays the whole text; only the painting is shortened. While shortened, the tooltip holds all of it
    and a click emits ``sig_clicked`` (the window then shows the whole text, to read and copy).
    """

    sig_clicked = Signal()

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setTextFormat(Qt.TextFormat.PlainText)

    def minimumSizeHint(self) -> QSize:
        """As wide as a few characters: the layout, not the text, decides the width."""
        return QSize(self.fontMetrics().averageCharWidth() * 8, super().minimumSizeHint().height())

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        """A click on a shortened line asks for it whole."""
        super().mouseReleaseEvent(event)
        if event.button() is Qt.MouseButton.LeftButton and self.is_elided():
            self.sig_clicked.emit()

    def is_elided(self) -> bool:
        """Whether the text is wider than the space it has."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, event: QPaintEvent) -> None:
        """Paints the text, shortened at its end to fit, and keeps the tooltip in step with it."""
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())
        tip = self.text() if shown != self.text() else ""
        if self.toolTip() != tip:
            self.setToolTip(tip)
        option = QStyleOptionFrame()
        self.initStyleOption(option)
        painter = QPainter(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_Widget, option, painter, self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), shown)
