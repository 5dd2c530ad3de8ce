"""The training and eval loss curves of a run (pyqtgraph), updated in place as points arrive."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QSize
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QWidget

from desktop.ui.widgets.charts import plot_filling

TRAIN_COLOUR = "#3b82f6"
EVAL_COLOUR = "#f97316"


def step_axis_end(last_step: int, total_steps: int, current: float) -> float:
    """Where the step axis ends: the run's last step when known, else room to grow (the axis changes rarely)."""
    if total_steps >= last_step and total_steps > 0:
        return float(total_steps)
    if last_step <= current:
        return current
    return float(max(10, 2 ** math.ceil(math.log2(last_step * 1.25))))


def loss_axis_range(lowest: float, highest: float, current: tuple[float, float]) -> tuple[float, float]:
    """The loss axis: kept while every loss is inside and fills a third of it, else re-fitted.

    A falling loss is what training shows, so a re-fitted axis leaves half the losses' span free below them (and a
    tenth above): it changes a few times over a run, not with every point.
    """
    if not (math.isfinite(lowest) and math.isfinite(highest)) or highest < lowest:
        return current
    low, high = current
    if low <= lowest and highest <= high and (highest - lowest) * 3 >= high - low:
        return current
    span = highest - lowest or abs(highest) / 10 or 1.0
    bottom = lowest - span / 2
    return (max(0.0, bottom) if lowest >= 0 else bottom, highest + span / 10)


class LossChart(QWidget):
    """Loss against step: a line for training loss, dots joined by a line for eval loss.

    The two curves are created once; :meth:`show_points` replaces their data with ``setData``, so updating the
    chart costs no more than drawing it. The axes do not auto-range: the step axis spans the run's steps, and the loss
    axis changes only when a loss leaves it or the losses shrink into a corner of it (re-ranging with every point
    rebuilt both axes at every poll: the chart's largest cost).
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
        plot.disableAutoRange()
        self._step_end, self._loss_range = 0.0, (0.0, 0.0)
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
        self,
        steps: Sequence[int],
        losses: Sequence[float],
        eval_steps: Sequence[int],
        eval_losses: Sequence[float],
        total_steps: int = 0,
    ) -> None:
        """Shows these points (the whole series each time; the curves keep their items) on a run of ``total_steps``."""
        self.train_curve.setData(list(steps), list(losses))
        self.eval_curve.setData(list(eval_steps), list(eval_losses))
        last_step = max(steps[-1] if steps else 0, eval_steps[-1] if eval_steps else 0)
        step_end = step_axis_end(last_step, total_steps, self._step_end)
        if step_end != self._step_end:
            self._step_end = step_end
            self.plot_widget.getPlotItem().setXRange(0, step_end, padding=0.02)
        finite = [loss for loss in (*losses, *eval_losses) if math.isfinite(loss)]
        if not finite:
            return
        loss_range = loss_axis_range(min(finite), max(finite), self._loss_range)
        if loss_range != self._loss_range:
            self._loss_range = loss_range
            self.plot_widget.getPlotItem().setYRange(*loss_range, padding=0)

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
