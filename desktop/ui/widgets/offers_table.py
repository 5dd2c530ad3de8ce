"""The offers table of the Compute step: one row per machine, judged against the run (fit, time, total)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QTableWidgetItem, QWidget

from desktop.core.sizing.plan import Fit
from desktop.core.sizing.report import format_hours
from desktop.core.units import card_text
from desktop.services.runs.offers_for_draft import DraftOffer
from desktop.ui.widgets.blocks import Badge
from desktop.ui.widgets.tables import pick_one_table

COLUMNS = ("Provider", "GPU", "Fits?", "Time", "Total", "$/hr", "Reliability", "Kind", "Location")
#: Rows shown at most (a large market has hundreds of machines: the best come first).
MAX_ROWS = 150
_FIT_BADGES = {Fit.FITS: ("Fits", "success"), Fit.TIGHT: ("Tight", "warning"), Fit.NO: ("No", "danger")}
_RIGHT = {3, 4, 5, 6}  # numbers line up on the right
_FIT_COLUMN = 2
#: The column saying on-demand or spot: hidden while a filter shows one kind only (every row would say the same).
KIND_COLUMN = COLUMNS.index("Kind")
_TIPS = {(6, "—"): "The provider publishes no reliability score"}


def gpu_words(item: DraftOffer) -> str:
    """``RTX 4090 · 24 GB``, ``2 x A100 · 80 GB each``, or a cluster's ``2 machines x 8 x H100 · 80 GB each``."""
    offer = item.offer
    memory = card_text(offer.vram_gb) + (" each" if offer.count * offer.nodes > 1 else "")
    gpus = f"{offer.count} x {offer.gpu}" if offer.count > 1 or offer.nodes > 1 else offer.gpu
    machines = f"{offer.nodes} machines x " if offer.nodes > 1 else ""
    return f"{machines}{gpus} · {memory}"


def fit_badge(item: DraftOffer) -> tuple[str, str]:
    """The fit as a badge: words and severity (``Unknown`` when the run could not be sized)."""
    return _FIT_BADGES.get(item.fit, ("Unknown", "info")) if item.fit is not None else ("Unknown", "info")


def _time_and_total(item: DraftOffer) -> tuple[str, str]:
    """Hours and dollars; none for a machine the job does not fit (it would fail, not take that long)."""
    if item.fit is Fit.NO:
        return "does not fit", "—"
    hours = format_hours(item.hours) if item.hours is not None else "unknown"
    return hours, f"${item.total_usd:,.2f}" if item.total_usd is not None else "unknown"


def cells(item: DraftOffer) -> list[str]:
    """The row's texts (the fit column holds a badge; its text is for screen readers and sorting by eye)."""
    offer = item.offer
    return [
        offer.provider.label,
        gpu_words(item),
        fit_badge(item)[0],
        *_time_and_total(item),
        f"${offer.price_per_hour:,.2f}",
        f"{offer.reliability * 100:.0f} %" if offer.reliability is not None else "—",
        "Spot" if offer.spot else "On-demand",
        place_words(offer.location),
    ]


_CLOUD_PLACE = re.compile(r"^(\w+) cloud \((.+)\)$")


def place_words(location: str) -> str:
    """Where the machine is, place first and short (``CA · community``): the column is the table's narrowest."""
    if not location:
        return "not given"
    found = _CLOUD_PLACE.match(location)
    return f"{found.group(2)} · {found.group(1)}" if found else location


class OffersTable(QWidget):
    """The judged offers, best first; the user picks one row.

    ``sig_picked`` carries the picked :class:`DraftOffer` (None when the selection is cleared).
    """

    sig_picked = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.table = pick_one_table(COLUMNS, "Offers, best first", len(COLUMNS) - 1)
        self.table.setMinimumHeight(240)
        price = self.table.horizontalHeaderItem(COLUMNS.index("$/hr"))
        if price is not None:  # pick_one_table set every header's label
            price.setToolTip("What the machine costs per hour, billed from its start until it is gone")
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 18)  # room for the badge
        self.table.itemSelectionChanged.connect(self.on_selection_changed)
        layout.addWidget(self.table)
        self.items: list[DraftOffer] = []
        self._quiet = False

    def show_offers(self, items: Sequence[DraftOffer]) -> None:
        """Fills the table (at most :data:`MAX_ROWS` rows) without announcing a pick."""
        self._quiet = True
        try:
            self.items = list(items[:MAX_ROWS])
            self.table.clearSelection()
            self.table.setRowCount(len(self.items))
            for row, item in enumerate(self.items):
                self._fill_row(row, item)
        finally:
            self._quiet = False

    def _fill_row(self, row: int, item: DraftOffer) -> None:
        for column, text in enumerate(cells(item)):
            cell = QTableWidgetItem("" if column == _FIT_COLUMN else text)  # the badge shows it: no text under it
            cell.setData(Qt.ItemDataRole.AccessibleTextRole, text)
            full = item.offer.location if column == len(COLUMNS) - 1 and item.offer.location else text
            cell.setToolTip(_TIPS.get((column, text), full))
            if column in _RIGHT:
                cell.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, column, cell)
        words, severity = fit_badge(item)
        holder = QWidget()
        holder.setAccessibleName(words)
        line = QHBoxLayout(holder)
        line.setContentsMargins(4, 2, 4, 2)
        line.addWidget(Badge(words, severity))
        self.table.setCellWidget(row, _FIT_COLUMN, holder)

    def select(self, key: tuple[str, str, bool] | None) -> DraftOffer | None:
        """Selects the offer with ``key`` (quietly); returns it, or None when it is not shown."""
        row = next((i for i, item in enumerate(self.items) if item.key == key), None)
        self._quiet = True
        try:
            if row is None:
                self.table.clearSelection()
                return None
            self.table.selectRow(row)
            self.table.scrollTo(self.table.model().index(row, 0))
        finally:
            self._quiet = False
        return self.items[row]

    def selected(self) -> DraftOffer | None:
        """The offer whose row is selected."""
        rows = self.table.selectionModel().selectedRows()
        return self.items[rows[0].row()] if rows else None

    def on_selection_changed(self) -> None:
        """Announces the user's pick."""
        if not self._quiet:
            self.sig_picked.emit(self.selected())
