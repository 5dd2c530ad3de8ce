"""A pyqtgraph plot filling a widget: skipped by Tab (nothing to operate) and without pyqtgraph's context menu."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QVBoxLayout, QWidget


def plot_filling(owner: QWidget) -> pg.PlotWidget:
    """Creates a plot that fills ``owner`` (which gets a margin-less layout) and returns it."""
    plot_widget = pg.PlotWidget()
    plot_widget.setFocusPolicy(Qt.FocusPolicy.NoFocus)
    layout = QVBoxLayout(owner)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(plot_widget)
    plot_widget.getPlotItem().setMenuEnabled(False)
    return plot_widget
