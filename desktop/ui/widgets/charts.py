"""Charts: a pyqtgraph plot filling a widget (loss curves), and the sizing step's stacked memory bar.

:func:`plot_filling` gives a plot skipped by Tab (nothing to operate) and without pyqtgraph's context menu; on a
scrolling page the wheel scrolls the page over it (:class:`PagePlot`), Ctrl+wheel zooms it.
:class:`MemoryBarChart` paints itself in the theme's colours: each segment keeps the colour its caller gives it
(so a category keeps its colour whatever else is shown), card sizes are marked with labels that never overlap, the
picked GPU's usable memory is drawn across the bar, and with nothing to show it says so instead of drawing an axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFontMetrics, QPainter, QPaintEvent, QPen, QPixmap, QWheelEvent
from PySide6.QtWidgets import QSizePolicy, QVBoxLayout, QWidget

from desktop.core.units import card_text, gb_of_gib, gib, memory_text
from desktop.ui.design.palette import Palette
from desktop.ui.theme import current_palette, theme_events

BAR_HEIGHT = 30
SIDE_MARGIN = 8
#: Room kept between two labels on the same row (pixels).
LABEL_GAP = 8
#: Maps decimal GB (the sizing's unit) to a pixel column; every text on the chart is in GiB.
_XOf = Callable[[float], float]


class PagePlot(pg.PlotWidget):  # type: ignore[misc]
    """A plot on a scrolling page: the wheel scrolls the page as anywhere else on it; Ctrl+wheel zooms the plot.

    pyqtgraph zooms on every wheel turn, so a page scrolled with the pointer over a chart stopped and zoomed it out.
    """

    def wheelEvent(self, event: QWheelEvent) -> None:
        """Zooms with Ctrl held; otherwise leaves the turn to the page (the event goes to the parent)."""
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            super().wheelEvent(event)
        else:
            event.ignore()


def plot_filling(owner: QWidget) -> pg.PlotWidget:
    """Creates a plot that fills ``owner`` (which gets a margin-less layout) and returns it."""
    plot_widget = PagePlot()
    plot_widget.setFocusPolicy(Qt.FocusPolicy.NoFocus)
    layout = QVBoxLayout(owner)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(plot_widget)
    plot_widget.getPlotItem().setMenuEnabled(False)
    return plot_widget


def theme_axes(plot_widget: pg.PlotWidget, palette: Palette) -> None:
    """Draws a plot's bottom and left axes, their ticks and labels in ``palette``'s muted colours."""
    plot = plot_widget.getPlotItem()
    for name in ("bottom", "left"):
        axis = plot.getAxis(name)
        axis.setPen(palette.border)
        axis.setTextPen(palette.text_muted)
        axis.label.setDefaultTextColor(pg.mkColor(palette.text_muted))


@dataclass(frozen=True)
class BarSegment:
    """One part of the stacked bar.

    Attributes:
        key: What it is (a memory component such as ``weights``).
        label: Its name for people.
        value: Its size in decimal GB, as the sizing computes it (the chart shows GiB).
        colour: Its fill colour (a palette colour).
        hatched: Drawn with diagonal lines over the colour (tells apart two parts that share a colour family).
    """

    key: str
    label: str
    value: float
    colour: str
    hatched: bool = False


@dataclass(frozen=True)
class Capacity:
    """The memory of the GPU picked, drawn across the bar.

    Attributes:
        label: The GPU's name.
        value: Its usable memory in decimal GB (shown in GiB).
    """

    label: str
    value: float


def nice_step(limit: float, most: int) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving at most ``most`` ticks up to ``limit``."""
    if limit <= 0:
        return 1.0
    raw = limit / max(1, most)
    power = 10 ** math.floor(math.log10(raw))
    return float(next(factor * power for factor in (1, 2, 5, 10) if factor * power >= raw))


def card_gb(nominal: float) -> float:
    """Where a card of ``nominal`` GiB sits on the bar, which is measured in the sizing's decimal GB."""
    return gb_of_gib(nominal)


def chart_limit(total: float, capacity: float | None, card_sizes: Sequence[float]) -> float:
    """The chart's width in GB: the bar, the picked GPU and the next card size up, with a little room."""
    base = max(total, capacity or 0.0)
    larger = [size for size in card_sizes if size >= base * 1.02]
    return (max(base, larger[0]) if larger else base) * 1.06 or 1.0


def swatch(segment: BarSegment, size: int = 12) -> QPixmap:
    """A small square in the segment's fill, for a legend."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    _fill(painter, QRectF(0, 0, size, size), segment, current_palette())
    painter.end()
    return pixmap


def _fill(painter: QPainter, rect: QRectF, segment: BarSegment, palette: Palette) -> None:
    painter.fillRect(rect, QColor(segment.colour))
    if segment.hatched:
        painter.fillRect(rect, QBrush(QColor(palette.surface), Qt.BrushStyle.BDiagPattern))


class MemoryBarChart(QWidget):
    """One stacked horizontal bar of memory per GPU, with card sizes and the picked GPU's usable memory marked.

    The bar is measured in the sizing's decimal GB; card sizes are given in GiB, and every label reads in GiB.
    """

    def __init__(self, card_sizes: Sequence[float] = (), parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.card_sizes = tuple(card_sizes)
        self.segments: list[BarSegment] = []
        self.capacity: Capacity | None = None
        self.empty_text = "Nothing to show yet."
        #: Card sizes whose label is drawn in the last paint (the others are too close to a drawn one).
        self.labelled_cards: list[float] = []
        #: Where those labels were drawn: (left, right) in pixels.
        self.card_label_spans: list[tuple[float, float]] = []
        #: The texts of the last paint: the card labels drawn, the capacity's, the axis ticks' (all in GiB).
        self.card_label_texts: list[str] = []
        self.capacity_text = ""
        self.axis_texts: list[str] = []
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        theme_events().sig_changed.connect(self.on_theme_changed)

    def on_theme_changed(self, _palette: Palette) -> None:
        """Repaints in the new theme's colours."""
        self.update()

    def sizeHint(self) -> QSize:
        """Four rows of text and the bar."""
        return QSize(600, self._row_height() * 4 + BAR_HEIGHT + 12)

    def minimumSizeHint(self) -> QSize:
        """As tall as :meth:`sizeHint`; any width."""
        return QSize(200, self.sizeHint().height())

    def show_segments(self, segments: Sequence[BarSegment], capacity: Capacity | None = None) -> None:
        """Draws ``segments`` (zero-sized ones are left out) left to right, and ``capacity`` across them."""
        self.segments = [segment for segment in segments if segment.value > 0]
        self.capacity = capacity
        self._describe()
        self.update()

    def show_empty(self, text: str) -> None:
        """Shows ``text`` instead of a bar (nothing sized yet, or nothing can be)."""
        self.segments, self.capacity, self.empty_text = [], None, text
        self._describe()
        self.update()

    def total(self) -> float:
        """The length of the stacked bar (GB)."""
        return sum(segment.value for segment in self.segments)

    def _describe(self) -> None:
        if not self.segments:
            self.setAccessibleDescription(self.empty_text)
            return
        parts = ", ".join(f"{s.label} {memory_text(s.value)}" for s in self.segments)
        gpu = f"; {self.capacity.label} has {memory_text(self.capacity.value)} usable" if self.capacity else ""
        self.setAccessibleDescription(f"{memory_text(self.total())} per GPU: {parts}{gpu}")

    def _row_height(self) -> int:
        return QFontMetrics(self.font()).height() + 4

    # -- painting ---------------------------------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:
        """Paints the empty state, or the bar with its card sizes, capacity line and axis."""
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = current_palette()
        if not self.segments:
            self.labelled_cards, self.card_label_spans, self.card_label_texts = [], [], []
            self.capacity_text, self.axis_texts = "", []
            painter.setPen(QColor(palette.text_muted))
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.empty_text)
            painter.end()
            return
        row = self._row_height()
        width = self.width() - 2 * SIDE_MARGIN
        cards = [card_gb(size) for size in self.card_sizes]
        limit = chart_limit(self.total(), self.capacity.value if self.capacity else None, cards)

        def x_of(value: float) -> float:
            return SIDE_MARGIN + width * min(value, limit) / limit

        bar = QRectF(SIDE_MARGIN, row, 0, BAR_HEIGHT)
        self._paint_bar(painter, bar, x_of, palette)
        self._paint_cards(painter, bar, x_of, palette, limit)
        self._paint_capacity(painter, bar, x_of, palette)
        self._paint_axis(painter, bar.bottom() + row + 4, x_of, palette, limit)
        painter.end()

    def _paint_bar(self, painter: QPainter, bar: QRectF, x_of: _XOf, palette: Palette) -> None:
        start = 0.0
        for segment in self.segments:
            left, right = x_of(start), x_of(start + segment.value)
            _fill(painter, QRectF(left, bar.top(), max(1.0, right - left), bar.height()), segment, palette)
            start += segment.value

    def _paint_cards(self, painter: QPainter, bar: QRectF, x_of: _XOf, palette: Palette, limit: float) -> None:
        metrics = QFontMetrics(self.font())
        painter.setPen(QPen(QColor(palette.text_muted), 1, Qt.PenStyle.DashLine))
        taken: list[tuple[float, float]] = []
        self.labelled_cards, self.card_label_spans, self.card_label_texts = [], taken, []
        for size in sorted(self.card_sizes, reverse=True):  # the largest cards keep their label first
            if card_gb(size) > limit:
                continue
            x = x_of(card_gb(size))
            painter.drawLine(QPointF(x, bar.top() - 2), QPointF(x, bar.bottom() + 2))
            text = f"{card_text(size)} card"
            half = metrics.horizontalAdvance(text) / 2
            left, right = max(0.0, x - half), min(float(self.width()), x + half)
            if any(left < end + LABEL_GAP and right > begin - LABEL_GAP for begin, end in taken):
                continue
            taken.append((left, right))
            self.labelled_cards.append(size)
            self.card_label_texts.append(text)
            painter.drawText(QRectF(left, 0, right - left, bar.top() - 2), Qt.AlignmentFlag.AlignCenter, text)

    def _paint_capacity(self, painter: QPainter, bar: QRectF, x_of: _XOf, palette: Palette) -> None:
        self.capacity_text = ""
        if self.capacity is None:
            return
        fits = self.total() <= self.capacity.value
        colour = QColor(palette.success if fits else palette.danger)
        x = x_of(self.capacity.value)
        painter.setPen(QPen(colour, 3))
        painter.drawLine(QPointF(x, bar.top() - 4), QPointF(x, bar.bottom() + 4))
        text = self.capacity_text = f"{self.capacity.label}: {memory_text(self.capacity.value)} usable"
        metrics = QFontMetrics(self.font())
        text_width = metrics.horizontalAdvance(text)
        left = min(max(0.0, x - text_width / 2), self.width() - text_width)
        painter.setPen(colour)
        painter.drawText(
            QRectF(left, bar.bottom() + 4, text_width, self._row_height()), Qt.AlignmentFlag.AlignLeft, text
        )

    def _paint_axis(self, painter: QPainter, y: float, x_of: _XOf, palette: Palette, limit: float) -> None:
        """The axis under the bar, ticked at round GiB (the bar's decimal GB converted), like every label."""
        metrics = QFontMetrics(self.font())
        limit_gib = gib(limit)
        widest = metrics.horizontalAdvance(f"{limit_gib:,.0f} GiB") + 2 * LABEL_GAP
        step = nice_step(limit_gib, max(2, int((self.width() - 2 * SIDE_MARGIN) / widest)))
        painter.setPen(QPen(QColor(palette.border), 1))
        painter.drawLine(QPointF(x_of(0), y), QPointF(x_of(limit), y))
        painter.setPen(QColor(palette.text_muted))
        self.axis_texts = []
        tick = 0.0
        while tick <= limit_gib:
            x = x_of(gb_of_gib(tick))
            painter.drawLine(QPointF(x, y), QPointF(x, y + 3))
            text = f"{tick:,.0f} GiB" if step >= 1 else f"{tick:.1f} GiB"
            self.axis_texts.append(text)
            text_width = metrics.horizontalAdvance(text)
            left = min(max(0.0, x - text_width / 2), self.width() - text_width)
            painter.drawText(QRectF(left, y + 3, text_width, self._row_height()), Qt.AlignmentFlag.AlignLeft, text)
            tick += step
