"""The training and eval loss curves of a run (pyqtgraph), updated in place as points arrive."""

from __future__ import annotations

from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QSize
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QWidget

from desktop.ui.widgets.charts import plot_filling

TRAIN_COLOUR = "#3b82f6"
EVAL_COLOUR = "#f97316"


class LossChart(QWidget):
    """Loss against step: a line for training loss, dots joined by a line for eval loss.

    The two curves are created once; :meth:`show_points` replaces their data with ``setData``, so updating the
    chart costs no more than drawing it.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Loss chart: training and eval loss by step")
        self.setMinimumHeight(220)
        self.plot_widget = plot_filling(self)
        plot = self.plot_widget.getPlotItem()
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setLabel("bottom", "Step")
        plot.setLabel("left", "Loss")
        plot.setClipToView(True)
        plot.setDownsampling(auto=True, mode="peak")
        plot.addLegend(offset=(-10, 10))
        self.train_curve = plot.plot([], [], name="Training loss", pen=pg.mkPen(TRAIN_COLOUR, width=2))
        self.eval_curve = plot.plot(
            [],
            [],
            name="Eval loss",
            pen=pg.mkPen(EVAL_COLOUR, width=2),
            symbol="o",
            symbolSize=7,
            symbolBrush=EVAL_COLOUR,
            symbolPen=None,
        )
        self._apply_palette()

    def show_points(
        self, steps: Sequence[int], losses: Sequence[float], eval_steps: Sequence[int], eval_losses: Sequence[float]
    ) -> None:
        """Shows these points (the whole series each time; the curves keep their items)."""
        self.train_curve.setData(list(steps), list(losses))
        self.eval_curve.setData(list(eval_steps), list(eval_losses))

    def sizeHint(self) -> QSize:
        """A modest preferred size, so the chart grows into the space there is rather than asking for more."""
        return QSize(480, 260)

    def point_counts(self) -> tuple[int, int]:
        """How many training and eval points the curves hold."""
        train_x, _ = self.train_curve.getData()
        eval_x, _ = self.eval_curve.getData()
        return (0 if train_x is None else len(train_x), 0 if eval_x is None else len(eval_x))

    def changeEvent(self, event: QEvent) -> None:
        """Follows light/dark switches."""
        super().changeEvent(event)
        if event.type() in {QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange}:
            self._apply_palette()

    def _apply_palette(self) -> None:
        palette = self.palette()
        self.plot_widget.setBackground(palette.color(QPalette.ColorRole.Base))
        text = palette.color(QPalette.ColorRole.Text)
        plot = self.plot_widget.getPlotItem()
        for name in ("bottom", "left"):
            axis = plot.getAxis(name)
            axis.setPen(text)
            axis.setTextPen(text)
