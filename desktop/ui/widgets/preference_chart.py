"""A preference run's chart (DPO, ORPO): how often the chosen answer wins, by step, on the training and held-out pairs.

It sits under the loss chart and is shown only for a run whose trainer logs rewards. The share is drawn in percent
on a fixed 0 to 100 axis (50 % is a coin toss: the line the model must leave), the step axis as the loss chart's.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import QSize
from PySide6.QtWidgets import QWidget

from desktop.core.runs.progress import RewardPoint
from desktop.ui.design.palette import Palette
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.charts import plot_filling, theme_axes
from desktop.ui.widgets.loss_chart import step_axis_end

#: A coin toss: a model that has learned nothing prefers the chosen answer about this often.
CHANCE_PERCENT = 50.0


def percents(points: Sequence[RewardPoint]) -> tuple[list[int], list[float]]:
    """Steps and the chosen answer's share of wins in percent."""
    return [point.step for point in points], [point.accuracy * 100 for point in points]


class PreferenceChart(QWidget):
    """The chosen answer's share of wins against step: a line for training pairs, dots for held-out pairs."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Preference chart: how often the chosen answer wins, by step")
        self.setMinimumHeight(180)
        self.plot_widget = plot_filling(self)
        plot = self.plot_widget.getPlotItem()
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setLabel("bottom", "Step")
        plot.setLabel("left", "Chosen wins (%)")
        plot.disableAutoRange()
        plot.hideButtons()  # pyqtgraph's auto-range "A": the axes are this chart's to set
        plot.setYRange(0, 100, padding=0.02)
        self._step_end = 0.0
        self.legend = plot.addLegend(offset=(-10, -10))
        self.chance_line = pg.InfiniteLine(pos=CHANCE_PERCENT, angle=0, movable=False)
        plot.addItem(self.chance_line)
        self.train_curve = plot.plot([], [], name="Training pairs")
        self.eval_curve = plot.plot([], [], name="Held-out pairs", symbol="o", symbolSize=7)
        self.apply_palette(current_palette())
        theme_events().sig_changed.connect(self.apply_palette)

    def show_points(
        self, rewards: Sequence[RewardPoint], eval_rewards: Sequence[RewardPoint], total_steps: int = 0
    ) -> None:
        """Shows these points (the whole series each time) on a run of ``total_steps``."""
        steps, shares = percents(rewards)
        eval_steps, eval_shares = percents(eval_rewards)
        self.train_curve.setData(steps, shares)
        self.train_curve.setSymbol("o" if len(steps) == 1 else None)
        self.eval_curve.setData(eval_steps, eval_shares)
        last_step = max([0, *steps[-1:], *eval_steps[-1:]])
        step_end = step_axis_end(last_step, total_steps, self._step_end)
        if step_end != self._step_end:
            self._step_end = step_end
            self.plot_widget.getPlotItem().setXRange(0, step_end, padding=0.02)

    def point_counts(self) -> tuple[int, int]:
        """How many training and held-out points the curves hold."""
        train_x, _ = self.train_curve.getData()
        eval_x, _ = self.eval_curve.getData()
        return (0 if train_x is None else len(train_x), 0 if eval_x is None else len(eval_x))

    def sizeHint(self) -> QSize:
        """A modest preferred size: the loss chart above it gets the room first."""
        return QSize(480, 200)

    def apply_palette(self, palette: Palette) -> None:
        """Draws the chart in ``palette``'s colours, the loss chart's for training and held-out."""
        train, evaluation = palette.chart[0], palette.chart[2]
        self.plot_widget.setBackground(palette.surface)
        self.train_curve.setPen(pg.mkPen(train, width=2))
        self.train_curve.setSymbolBrush(train)
        self.train_curve.setSymbolPen(None)
        self.eval_curve.setPen(pg.mkPen(evaluation, width=2))
        self.eval_curve.setSymbolBrush(evaluation)
        self.eval_curve.setSymbolPen(None)
        self.chance_line.setPen(pg.mkPen(palette.border, width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        theme_axes(self.plot_widget, palette)
        self.legend.setLabelTextColor(palette.text)
        self.legend.setBrush(pg.mkBrush(palette.surface))
        self.legend.setPen(pg.mkPen(palette.border))
        for _sample, label in self.legend.items:
            label.setText(label.text, color=palette.text)
