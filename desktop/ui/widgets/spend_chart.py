"""Spend over time as stacked bars, one colour per provider (pyqtgraph), following light and dark."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from desktop.services.billing.spend import PeriodSpend
from desktop.ui.cost_words import PROVIDER_ORDER, money, provider_colour_index, provider_label
from desktop.ui.design.palette import Palette
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.charts import plot_filling

#: The width of a bar, as a share of its slot.
BAR_WIDTH = 0.66


def period_label(period: PeriodSpend, by_month: bool, index: int, count: int) -> str:
    """A bar's axis label: ``Dec`` (with the year in January and on the first bar) or ``Dec 3`` (every 5th day)."""
    moment = datetime.fromtimestamp(period.start)
    if by_month:
        return moment.strftime("%b %Y" if index == 0 or moment.month == 1 else "%b")
    if index % 5 != (count - 1) % 5:
        return ""  # every fifth day, counted back from today, keeps the labels apart
    return f"{moment.strftime('%b')} {moment.day}"


def stacks(periods: Sequence[PeriodSpend]) -> list[tuple[str, list[float], list[float]]]:
    """Per provider (in :data:`PROVIDER_ORDER`, then others), its bar heights and where each bar starts."""
    keys = [key for key in PROVIDER_ORDER if any(p.by_provider.get(key) for p in periods)]
    keys += sorted({key for p in periods for key in p.by_provider} - set(keys))
    base = [0.0] * len(periods)
    result = []
    for key in keys:
        heights = [period.by_provider.get(key, 0.0) for period in periods]
        result.append((key, heights, list(base)))
        base = [b + h for b, h in zip(base, heights, strict=True)]
    return result


def dollar_ticks(values: Sequence[float], spacing: float) -> list[str]:
    """Tick labels in dollars with as many decimals as the spacing needs: ``$0.015``, ``$0.02``, ``$1,200``."""
    places = max(0, math.ceil(-math.log10(spacing))) if spacing > 0 else 2
    return [f"${value:,.{places}f}" for value in values]


class DollarAxis(pg.AxisItem):  # type: ignore[misc]
    """A value axis that writes dollars as dollars, never scaled by an SI prefix.

    pyqtgraph's axis scales small values by 1000 (cents drew as "15" for $0.015) once it has measured a range with
    its label shown, even when automatic prefixes are off: this axis keeps its scale at 1.
    """

    def __init__(self) -> None:
        super().__init__("left")
        self.enableAutoSIPrefix(False)

    def updateAutoSIPrefix(self) -> None:
        """Keeps the scale at 1 (dollars) whatever the range."""
        self.autoSIPrefixScale = 1.0
        self.labelUnitPrefix = ""
        self._updateLabel()

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        """Each tick in dollars (``scale`` is always 1 here)."""
        return dollar_ticks([value * scale for value in values], spacing * scale)


def _swatch(colour: str) -> QPixmap:
    pixmap = QPixmap(12, 12)
    pixmap.fill(QColor(colour))
    return pixmap


class SpendChart(QWidget):
    """Stacked bars of dollars per month (or day), coloured by provider, with a legend under them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Spending over time, by provider")
        self.setMinimumHeight(240)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        holder = QWidget()
        self.plot_widget = plot_filling(holder)
        self.plot_widget.getPlotItem().setAxisItems({"left": DollarAxis()})
        layout.addWidget(holder, 1)
        self.legend = QHBoxLayout()
        self.legend.setSpacing(14)
        layout.addLayout(self.legend)
        plot = self.plot_widget.getPlotItem()
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        plot.showGrid(x=False, y=True, alpha=0.25)
        plot.getAxis("left").setZValue(-1000)  # the grid lines it draws go behind the bars, not across them
        self.periods: tuple[PeriodSpend, ...] = ()
        self.by_month = True
        self.bars: list[pg.BarGraphItem] = []
        theme_events().sig_changed.connect(self._on_theme)
        self._draw(current_palette())

    def sizeHint(self) -> QSize:
        """A modest preferred size: the chart grows into the space there is."""
        return QSize(520, 260)

    def show_periods(self, periods: Sequence[PeriodSpend], *, by_month: bool) -> None:
        """Draws ``periods`` (oldest first); a redraw happens only when a cent changed."""
        periods = tuple(periods)
        if by_month == self.by_month and _cents(periods) == _cents(self.periods):
            return
        self.periods, self.by_month = periods, by_month
        self._draw(current_palette())

    def _on_theme(self, palette: Palette) -> None:
        self._draw(palette)

    def _draw(self, palette: Palette) -> None:
        plot = self.plot_widget.getPlotItem()
        for bar in self.bars:
            plot.removeItem(bar)
        self.bars = []
        self.plot_widget.setBackground(QColor(palette.surface))
        for name in ("bottom", "left"):
            axis = plot.getAxis(name)
            axis.setPen(QColor(palette.border))
            axis.setTextPen(QColor(palette.text_muted))
        xs = list(range(len(self.periods)))
        for key, heights, base in stacks(self.periods):
            colour = palette.chart[provider_colour_index(key) % len(palette.chart)]
            bar = pg.BarGraphItem(x=xs, height=heights, y0=base, width=BAR_WIDTH, brush=colour, pen=pg.mkPen(None))
            plot.addItem(bar)
            self.bars.append(bar)
        count = len(self.periods)
        ticks = [(i, period_label(p, self.by_month, i, count)) for i, p in enumerate(self.periods)]
        plot.getAxis("bottom").setTicks([ticks])
        plot.getAxis("left").setLabel("Dollars", color=palette.text_muted)
        top = max((p.usd for p in self.periods), default=0.0)
        plot.setXRange(-0.6, max(0, count - 1) + 0.6, padding=0)
        plot.setYRange(0, top * 1.12 if top > 0 else 1.0, padding=0)
        self._fill_legend(palette)

    def _fill_legend(self, palette: Palette) -> None:
        while self.legend.count():
            item = self.legend.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        for key, heights, _base in stacks(self.periods):
            swatch = QLabel()
            swatch.setPixmap(_swatch(palette.chart[provider_colour_index(key) % len(palette.chart)]))
            text = QLabel(f"{provider_label(key)} {money(sum(heights))}")
            text.setAccessibleName(f"{provider_label(key)}: {money(sum(heights))} in the period shown")
            pair = QWidget()
            row = QHBoxLayout(pair)
            row.setContentsMargins(0, 0, 0, 0)
            row.setSpacing(6)
            row.addWidget(swatch, 0, Qt.AlignmentFlag.AlignVCenter)
            row.addWidget(text)
            self.legend.addWidget(pair)
        self.legend.addStretch(1)


def _cents(periods: Sequence[PeriodSpend]) -> list[tuple[float, tuple[tuple[str, int], ...]]]:
    return [(p.start, tuple(sorted((k, round(v * 100)) for k, v in p.by_provider.items()))) for p in periods]
