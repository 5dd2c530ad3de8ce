"""A chart on a scrolling page (the monitor's loss, the costs' spending): the wheel over it is left to the page, as
anywhere else on it; Ctrl+wheel zooms the chart.

A wheel turn a chart ignores goes on to the widgets around it (Qt propagates the window system's wheel events; the
page then scrolls, seen under Xvfb with xdotool). Events made here are not the window system's, and Qt does not
propagate those, so this test checks what the chart does with the turn: ignore it, or zoom with Ctrl.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from desktop.ui.widgets.charts import plot_filling


def turn_wheel(plot: QWidget, modifiers: Qt.KeyboardModifier) -> QWheelEvent:
    """One notch down with the pointer over the middle of the chart; returns the event (accepted or not)."""
    viewport = plot.viewport()  # type: ignore[attr-defined]
    inside = QPointF(viewport.width() / 2, viewport.height() / 2)
    outside = QPointF(viewport.mapToGlobal(inside.toPoint()))
    event = QWheelEvent(
        inside, outside, QPoint(), QPoint(0, -120), Qt.MouseButton.NoButton, modifiers, Qt.ScrollPhase.NoScrollPhase,
        False,
    )  # fmt: skip
    QApplication.sendEvent(viewport, event)
    return event


def test_the_wheel_over_a_chart_is_left_to_the_page_and_ctrl_wheel_zooms_it(qtbot: QtBot) -> None:
    holder = QWidget()
    holder.resize(500, 300)
    plot = plot_filling(holder)
    plot.plot([0, 1, 2, 3], [2.0, 1.5, 1.2, 1.0])
    qtbot.addWidget(holder)
    holder.show()
    qtbot.waitExposed(holder)
    before = plot.getViewBox().viewRange()
    plain = turn_wheel(plot, Qt.KeyboardModifier.NoModifier)
    assert not plain.isAccepted(), "left to the page around the chart"
    assert plot.getViewBox().viewRange() == before, "the chart kept its range"
    turn_wheel(plot, Qt.KeyboardModifier.ControlModifier)
    assert plot.getViewBox().viewRange() != before, "Ctrl+wheel zooms the chart"
