"""A year's cost against hours of training a year, renting and owning (pyqtgraph).

Renting is a line through zero, owning a line that starts at its loss of value; the user's own hours are marked on
both, and the break-even where they cross.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from desktop.core.costs.rent_or_buy import RentOrBuy
from desktop.ui.design.palette import Palette
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.charts import plot_filling, theme_axes
from desktop.ui.widgets.spend_chart import DollarAxis

#: The legend's entries under the plot (the owned side's words follow the card).
LEGEND = {"rent": "Renting", "own": "Owning", "you": "Your hours"}
#: The chart always shows at least this many hours a year.
MIN_HOURS = 100.0


def hours_axis_end(comparison: RentOrBuy) -> float:
    """Where the hours axis ends: past both the user's hours and the break-even, so both are seen with room."""
    even = comparison.break_even_hours or 0.0
    return max(MIN_HOURS, 1.5 * comparison.rented.hours_per_year, 1.5 * even)


def _swatch(colour: str, *, dot: bool = False) -> QPixmap:
    pixmap = QPixmap(14, 14)
    pixmap.fill(QColor(0, 0, 0, 0))
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(colour))
    if dot:
        painter.drawEllipse(3, 3, 8, 8)
    else:
        painter.drawRect(0, 6, 14, 3)
    painter.end()
    return pixmap


class RentOrBuyChart(QWidget):
    """Dollars a year against hours of rented training a year, for renting and for owning one card."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Chart: a year's cost of renting and of owning, by hours of training a year")
        self.setMinimumHeight(240)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        holder = QWidget()
        self.plot_widget = plot_filling(holder)
        layout.addWidget(holder)
        plot = self.plot_widget.getPlotItem()
        plot.setAxisItems({"left": DollarAxis()})
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setLabel("bottom", "Hours of rented training a year")
        plot.setLabel("left", "Dollars a year")
        self.rent_curve = plot.plot([], [])
        self.own_curve = plot.plot([], [])
        self.you = plot.plot([], [], pen=None, symbol="o", symbolSize=9)
        legend = QHBoxLayout()  # under the plot: over it, it hid the lines wherever they ran
        legend.setSpacing(16)
        self.legend_labels = {name: (QLabel(), QLabel(text)) for name, text in LEGEND.items()}
        for swatch, words in self.legend_labels.values():
            legend.addWidget(swatch)
            legend.addWidget(words)
        legend.addStretch(1)
        layout.addLayout(legend)
        self.break_even = pg.InfiniteLine(angle=90, movable=False)
        plot.addItem(self.break_even)
        self.comparison: RentOrBuy | None = None
        self.apply_palette(current_palette())
        theme_events().sig_changed.connect(self.apply_palette)

    def sizeHint(self) -> QSize:
        """A modest preferred size: the chart grows into the space there is."""
        return QSize(520, 260)

    def show_comparison(self, comparison: RentOrBuy) -> None:
        """Draws both lines over the hours that matter, the user's hours on each, and the break-even."""
        self.comparison = comparison
        end = hours_axis_end(comparison)
        xs = [0.0, end]
        self.rent_curve.setData(xs, [comparison.rent_usd(x) for x in xs])
        self.own_curve.setData(xs, [comparison.own_usd(x) for x in xs])
        hours = comparison.rented.hours_per_year
        self.you.setData([hours, hours], [comparison.rent_usd(hours), comparison.own_usd(hours)])
        words = comparison.card.owning_words
        self.legend_labels["own"][1].setText(words[:1].upper() + words[1:])
        even = comparison.break_even_hours
        self.break_even.setVisible(even is not None)
        if even is not None:
            self.break_even.setValue(even)
        top = max(comparison.rent_usd(end), comparison.own_usd(end))
        plot = self.plot_widget.getPlotItem()
        plot.setXRange(0, end, padding=0)
        plot.setYRange(0, top * 1.08, padding=0)
        self.apply_palette(current_palette())

    def apply_palette(self, palette: Palette) -> None:
        """Draws the chart in ``palette``'s colours."""
        rent, own = palette.chart[0], palette.chart[2]
        self.plot_widget.setBackground(palette.surface)
        self.rent_curve.setPen(pg.mkPen(rent, width=2))
        self.own_curve.setPen(pg.mkPen(own, width=2))
        self.you.setSymbolBrush(palette.text)
        self.you.setSymbolPen(None)
        self.break_even.setPen(pg.mkPen(palette.text_muted, width=1, style=Qt.PenStyle.DashLine))
        theme_axes(self.plot_widget, palette)
        colours = {"rent": rent, "own": own, "you": palette.text}
        for name, (swatch, _words) in self.legend_labels.items():
            swatch.setPixmap(_swatch(colours[name], dot=name == "you"))

    def line_values(self) -> dict[str, list[tuple[float, float]]]:
        """The drawn points of each line: ``rent``, ``own`` and ``you`` (the user's hours on both)."""
        values = {}
        for name, curve in (("rent", self.rent_curve), ("own", self.own_curve), ("you", self.you)):
            xs, ys = curve.getData()
            values[name] = [] if xs is None else [(float(x), float(y)) for x, y in zip(xs, ys, strict=True)]
        return values
