"""The training and eval loss curves of a run (pyqtgraph), updated in place as points arrive."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QLabel, QStackedLayout, QWidget

from desktop.ui.design.palette import Palette
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.blocks import set_role
from desktop.ui.widgets.charts import plot_filling, theme_axes

#: What the chart says before the trainer reports its first loss.
EMPTY_TEXT = "Loss appears after the first steps."


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

    Before the first loss it says so instead of drawing an empty grid. The two curves are created once;
    :meth:`show_points` replaces their data with ``setData``, so updating the chart costs no more than drawing it.
    The axes do not auto-range: the step axis spans the run's steps, and the loss axis changes only when a loss
    leaves it or the losses shrink into a corner of it (re-ranging with every point rebuilt both axes at every poll:
    the chart's largest cost). :meth:`clear` forgets the axes, so another run never inherits them. Colours come from
    the app's palette and follow a theme switch.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Loss chart: training and eval loss by step")
        self.setMinimumHeight(220)
        self._views = QStackedLayout(self)
        self.empty_label = QLabel(EMPTY_TEXT)
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setWordWrap(True)
        self.empty_label.setAccessibleName(EMPTY_TEXT)
        set_role(self.empty_label, "caption")
        self._views.addWidget(self.empty_label)
        holder = QWidget()
        self._views.addWidget(holder)
        self.plot_widget = plot_filling(holder)
        plot = self.plot_widget.getPlotItem()
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setLabel("bottom", "Step")
        plot.setLabel("left", "Loss")
        plot.setClipToView(True)
        plot.disableAutoRange()
        plot.hideButtons()  # pyqtgraph's auto-range "A": the axes are this chart's to set
        self._step_end, self._loss_range = 0.0, (0.0, 0.0)
        plot.setDownsampling(auto=True, mode="peak")
        self.legend = plot.addLegend(offset=(-10, 10))
        self.train_curve = plot.plot([], [], name="Training loss")
        self.eval_curve = plot.plot([], [], name="Eval loss", symbol="o", symbolSize=7)
        self.apply_palette(current_palette())
        theme_events().sig_changed.connect(self.apply_palette)

    def show_points(
        self,
        steps: Sequence[int],
        losses: Sequence[float],
        eval_steps: Sequence[int],
        eval_losses: Sequence[float],
        total_steps: int = 0,
    ) -> None:
        """Shows these points (the whole series each time; the curves keep their items) on a run of ``total_steps``."""
        if not steps and not eval_steps:
            self.clear()
            return
        self._views.setCurrentIndex(1)
        self.train_curve.setData(list(steps), list(losses))
        lonely = len(steps) == 1  # a line of one point draws nothing: it gets a dot until the second comes
        if (self.train_curve.opts["symbol"] is not None) != lonely:
            self.train_curve.setSymbol("o" if lonely else None)
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

    def clear(self) -> None:
        """Shows no points and forgets the axes (another run starts afresh); says that the loss comes later."""
        self.train_curve.setData([], [])
        self.eval_curve.setData([], [])
        self._step_end, self._loss_range = 0.0, (0.0, 0.0)
        self._views.setCurrentIndex(0)

    def showing_points(self) -> bool:
        """Whether the plot is shown (False while the empty state is)."""
        return self._views.currentIndex() == 1

    def axis_ranges(self) -> tuple[float, tuple[float, float]]:
        """Where the step axis ends and the loss axis's range, as last set."""
        return self._step_end, self._loss_range

    def sizeHint(self) -> QSize:
        """A modest preferred size, so the chart grows into the space there is rather than asking for more."""
        return QSize(480, 260)

    def point_counts(self) -> tuple[int, int]:
        """How many training and eval points the curves hold."""
        train_x, _ = self.train_curve.getData()
        eval_x, _ = self.eval_curve.getData()
        return (0 if train_x is None else len(train_x), 0 if eval_x is None else len(eval_x))

    def apply_palette(self, palette: Palette) -> None:
        """Draws the chart in ``palette``'s colours: its surface, muted axes, the first two chart colours."""
        train, evaluation = palette.chart[0], palette.chart[2]
        self.plot_widget.setBackground(palette.surface)
        self.train_curve.setPen(pg.mkPen(train, width=2))
        self.eval_curve.setPen(pg.mkPen(evaluation, width=2))
        self.eval_curve.setSymbolBrush(evaluation)
        self.eval_curve.setSymbolPen(None)
        self.train_curve.setSymbolBrush(train)
        self.train_curve.setSymbolPen(None)
        theme_axes(self.plot_widget, palette)
        self.legend.setLabelTextColor(palette.text)
        self.legend.setBrush(pg.mkBrush(palette.surface))
        self.legend.setPen(pg.mkPen(palette.border))
        for _sample, label in self.legend.items:
            label.setText(label.text, color=palette.text)
