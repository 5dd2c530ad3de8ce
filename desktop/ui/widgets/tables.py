"""Tables the user picks one row from (runs, GPU options, catalog models)."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget


def pick_one_table(columns: Sequence[str], accessible_name: str, stretch_column: int) -> QTableWidget:
    """A read-only table selecting whole rows, one at a time; Tab leaves it; one column takes the spare width."""
    table = QTableWidget(0, len(columns))
    table.setAccessibleName(accessible_name)
    table.setHorizontalHeaderLabels(list(columns))
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setTabKeyNavigation(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(stretch_column, QHeaderView.ResizeMode.Stretch)
    return table
