"""What fine-tuning has cost: today, this month, per provider, per month and per run, and the machines billing now."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.services.billing.ledger import LedgerError
from desktop.services.billing.meter import BillingMachine, MeterReading
from desktop.services.billing.spend import RunCost, SpendOverview
from desktop.services.runs.bill import MonthIdle
from desktop.ui.background import off_ui_thread, spawn
from desktop.ui.cost_words import machine_name, money, provider_label, rate, short_run, upper_first
from desktop.ui.design.palette import METRICS
from desktop.ui.meter import CostMeter
from desktop.ui.pages.base import BasePage
from desktop.ui.run_words import state_badge
from desktop.ui.widgets.blocks import Card, EmptyState, caption, destructive_button, heading
from desktop.ui.widgets.bucket_cost_card import BucketCostCard
from desktop.ui.widgets.rent_or_buy_card import RentOrBuyCard
from desktop.ui.widgets.spend_chart import SpendChart
from desktop.ui.widgets.tables import pick_one_table

PROVIDER_COLUMNS = ("Provider", "Spent", "Share")
RUN_COLUMNS = ("Run", "Model", "Where", "State", "Spent", "Now")
NUMERIC_COLUMNS = frozenset({"Spent", "Share", "Now"})
FOOTNOTE = (
    "Dollars are estimates: rented machines at the price per hour recorded when they were rented, your own servers "
    "at the hourly rate you gave the run. Your provider's bill is the final word. Days and months are this "
    "computer's. \u201cest.\u201d: a machine's end is when Rentune saw it gone, not a time its provider reported."
)


def provider_rows(overview: SpendOverview) -> list[tuple[str, ...]]:
    """The cells of the per-provider table: name, dollars, share of the total."""
    total = overview.total_usd or 1.0
    return [(provider_label(key), money(usd), f"{usd / total:.0%}") for key, usd in overview.by_provider]


def run_rows(runs: Sequence[RunCost]) -> list[tuple[str, ...]]:
    """The cells of the per-run table: id, model, where it billed, state, dollars, rate now."""
    rows: list[tuple[str, ...]] = []
    for cost in runs:
        record = cost.record
        model = str(record.spec.get("base_model") or "—") if record else "—"
        state = state_badge(record)[0] if record else "Deleted"  # the words of the Runs page and the monitor
        where = ", ".join(provider_label(key) for key in cost.providers) or "—"
        now = rate(cost.spend.rate_per_hour) if cost.spend.billing else "—"
        estimated = any(rental.end_estimated for rental in cost.spend.rentals)
        spent = money(cost.spend.usd) + (" est." if estimated else "")
        rows.append((cost.run_id, model, where, state, spent, now))
    return rows


IDLE_TIP = (
    "What rented machines billed this month while none of them trained: renting, setup and upload, waiting on your "
    "answer, bringing home, export and teardown. A run's monitor shows its own; rentune costs --run RUN splits it."
)


def idle_words(idle: MonthIdle) -> str:
    """This month's paid idle under its dollars: what rented machines billed while none of them trained."""
    if idle.usd <= 0:
        return ""
    return f"{money(idle.idle_usd)} paid idle on rented machines ({100 * idle.idle_usd / idle.usd:.0f}\u00a0%)"


def fill_table(table: QTableWidget, rows: Sequence[tuple[str, ...]]) -> None:
    """Shows ``rows`` in ``table`` (changed cells only) and makes it as tall as its rows: the page scrolls, not it."""
    table.setRowCount(len(rows))
    for index, cells in enumerate(rows):
        for column, text in enumerate(cells):
            item = table.item(index, column)
            if item is None:
                item = QTableWidgetItem(text)
                if column in _numeric_columns(table):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                table.setItem(index, column, item)
            elif item.text() != text:
                item.setText(text)
    header = table.horizontalHeader().sizeHint().height()
    rows_height = sum(table.rowHeight(i) for i in range(len(rows))) or 0
    table.setFixedHeight(header + rows_height + 2 * table.frameWidth() + 2)


def _numeric_columns(table: QTableWidget) -> set[int]:
    headers = [table.horizontalHeaderItem(i) for i in range(table.columnCount())]
    return {i for i, header in enumerate(headers) if header is not None and header.text() in NUMERIC_COLUMNS}


class StatCard(Card):
    """A small card with one number: ``Today`` / ``$1.23``."""

    def __init__(self, title: str) -> None:
        super().__init__()
        self.caption_label = caption(title)
        self.value_label = heading("—", METRICS.title_scale * 0.85)
        self.detail_label = caption()
        self.detail_label.setWordWrap(True)
        self.detail_label.hide()
        self.setAccessibleName(title)
        self.body.addWidget(self.caption_label)
        self.body.addWidget(self.value_label)
        self.body.addWidget(self.detail_label)

    def show_value(self, text: str) -> None:
        """Shows the number."""
        self.value_label.setText(text)
        self._name()

    def show_detail(self, text: str) -> None:
        """Shows a line under the number (none when ``text`` is empty)."""
        self.detail_label.setText(text)
        self.detail_label.setVisible(bool(text))
        self._name()

    def _name(self) -> None:
        detail = f", {self.detail_label.text()}" if self.detail_label.text() else ""
        self.setAccessibleName(f"{self.caption_label.text()}: {self.value_label.text()}{detail}")


class MachineRow(QWidget):
    """A machine billing now: what it is, whose it is, its rate, what it cost so far, and its Stop button."""

    def __init__(self, machine: BillingMachine, on_stop: Callable[[BillingMachine], None]) -> None:
        super().__init__()
        self.machine = machine
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 4, 0, 4)
        texts = QVBoxLayout()
        texts.setSpacing(2)
        self.name_label = QLabel()
        font = self.name_label.font()
        font.setBold(True)
        self.name_label.setFont(font)
        self.detail_label = caption()
        texts.addWidget(self.name_label)
        texts.addWidget(self.detail_label)
        row.addLayout(texts, 1)
        self.rate_label = QLabel()
        self.rate_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        row.addWidget(self.rate_label)
        self.stop_button = destructive_button("Stop…" if machine.owned else "Terminate…", "circle-stop")
        self.stop_button.clicked.connect(lambda _checked=False: on_stop(self.machine))
        row.addWidget(self.stop_button)
        self.show_machine(machine)

    def show_machine(self, machine: BillingMachine, run_usd: float | None = None) -> None:
        """Shows the machine's current numbers (and the run's, when the run also paid for other machines)."""
        self.machine = machine
        self.name_label.setText(upper_first(machine_name(machine)))
        whose = short_run(machine.run_id) if machine.owned else "no run uses it: it bills for nothing"
        these = "this machine" if machine.machines == 1 else f"these {machine.machines} machines"
        so_far = f" · {these} {money(machine.usd)} so far" if machine.usd > 0 else ""
        if run_usd is not None and money(run_usd) != money(machine.usd):
            so_far += f" · the run {money(run_usd)} in all"
        self.detail_label.setText(f"{upper_first(whose)}{so_far}")
        self.rate_label.setText(rate(machine.rate_per_hour))
        verb = "Stop" if machine.owned else "Terminate"
        self.stop_button.setAccessibleName(f"{verb} {machine_name(machine)}, {rate(machine.rate_per_hour)}")


class CostsPage(BasePage):
    """Spend per run, per provider and per month with a chart, and the machines running now with a Stop each.

    Signals:
        sig_stop: A machine (:class:`~desktop.services.billing.meter.BillingMachine`) the user wants stopped; the cost
            tracker asks and stops it.
    """

    page_name = "costs"
    title = "Costs"
    icon_name = "wallet"
    purpose = "What your fine-tunes cost, and what bills right now. Stop anything from here."
    sig_stop = Signal(object)

    def __init__(
        self,
        idle: Callable[[], MonthIdle] | None = None,
        rent_or_buy: RentOrBuyCard | None = None,
        bucket: BucketCostCard | None = None,
        parent: QWidget | None = None,
    ) -> None:
        """``idle``: reads this month's paid idle (blocking; run off the UI thread), None to show none.

        ``rent_or_buy``: the card weighing renting against owning, shown under the spending (even before any).
        ``bucket``: the card saying what the user's bucket holds and costs a month.
        """
        super().__init__(parent)
        self.idle = idle
        self.rent_or_buy = rent_or_buy
        self.bucket = bucket
        self._idle_task: asyncio.Task[None] | None = None
        self.meter: CostMeter | None = None
        self.reading: MeterReading | None = None
        self.rows: dict[str, MachineRow] = {}
        self.empty = self._build_empty()
        self.content = self._build_content()
        self.body.addWidget(self.empty)
        self.body.addWidget(self.content)
        if rent_or_buy is not None:
            self.body.addWidget(rent_or_buy)
        if bucket is not None:
            self.body.addWidget(bucket)
        self.body.addStretch(1)
        self.content.hide()

    def _build_empty(self) -> QWidget:
        return EmptyState(
            "wallet",
            "Nothing spent yet",
            "When a fine-tune rents a GPU, or runs on your own server with an hourly rate, its cost appears here: "
            "today, this month, per provider and per run, with the machines billing right now and a Stop for each.",
        )

    def _build_content(self) -> QWidget:
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(METRICS.gap)
        layout.addLayout(self._build_stats())
        layout.addWidget(self._build_machines())
        layout.addWidget(self._build_chart())
        self.provider_card, self.provider_table = self._table_card("By provider", PROVIDER_COLUMNS, 0)
        self.run_card, self.run_table = self._table_card("By run", RUN_COLUMNS, 1)
        layout.addWidget(self.provider_card)
        layout.addWidget(self.run_card)
        layout.addWidget(caption(FOOTNOTE))
        return content

    def _build_stats(self) -> QGridLayout:
        grid = QGridLayout()
        grid.setSpacing(METRICS.gap)
        self.today_card, self.month_card = StatCard("Today"), StatCard("This month")
        self.total_card, self.burn_card = StatCard("All time"), StatCard("Billing now")
        for column, card in enumerate((self.today_card, self.month_card, self.total_card, self.burn_card)):
            grid.addWidget(card, 0, column)
            grid.setColumnStretch(column, 1)
        return grid

    def _build_machines(self) -> Card:
        card = Card("Running now", "Stopping a run saves a checkpoint and brings it home before its machine goes.")
        self.machines_box = QVBoxLayout()
        self.machines_box.setSpacing(0)
        card.body.addLayout(self.machines_box)
        self.no_machines = caption("Nothing is billing now.")
        self.no_machines.setAccessibleName("Nothing is billing now")
        card.body.addWidget(self.no_machines)
        self.machines_card = card
        return card

    def _build_chart(self) -> Card:
        card = Card("Spending over time")
        self.period_combo = QComboBox()
        self.period_combo.setAccessibleName("Show spending by month or by day")
        self.period_combo.addItem("Last 12 months", True)
        self.period_combo.addItem("Last 30 days", False)
        self.period_combo.currentIndexChanged.connect(self.on_period_changed)
        card.add_header_widget(self.period_combo)
        self.chart = SpendChart()
        card.body.addWidget(self.chart)
        self.chart_card = card
        return card

    def _table_card(self, title: str, columns: Sequence[str], stretch: int) -> tuple[Card, QTableWidget]:
        card = Card(title)
        table = pick_one_table(columns, f"Spending {title.lower()}", stretch_column=stretch)
        table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        card.body.addWidget(table)
        return card, table

    # -- following the meter ---------------------------------------------------------------------------------------

    def follow(self, meter: CostMeter) -> None:
        """Shows every reading of ``meter`` (the one the tray and the status bar show)."""
        self.meter = meter
        meter.sig_updated.connect(self.show_reading)
        if meter.latest is not None:
            self.show_reading(meter.latest)

    async def load(self) -> None:
        """Waits for the meter's current read, so the page opens with numbers; weighs renting against owning again."""
        if self.rent_or_buy is not None:
            self.rent_or_buy.refresh()
        if self.bucket is not None:
            self.bucket.refresh()
        if self.meter is not None:
            await self.meter.refresh().wait()

    def show_reading(self, reading: MeterReading) -> None:
        """Draws a reading: the sums, the machines, the chart and the tables."""
        self.reading = reading
        overview = reading.overview
        nothing = overview.empty and not reading.machines
        self.empty.setVisible(nothing)
        self.content.setVisible(not nothing)
        self.today_card.show_value(money(overview.today_usd))
        self.month_card.show_value(money(overview.month_usd))
        self.total_card.show_value(money(overview.total_usd))
        self.burn_card.show_value(rate(reading.burn_per_hour) if reading.machines else "$0.00/h")
        self._show_machines(reading.machines, {cost.run_id: cost.spend.usd for cost in overview.runs})
        self.on_period_changed()
        fill_table(self.provider_table, provider_rows(overview))
        fill_table(self.run_table, run_rows(overview.runs))
        self.run_card.setVisible(bool(overview.runs))
        if self.idle is not None and self.isVisible() and (self._idle_task is None or self._idle_task.done()):
            self._idle_task = spawn(self._show_idle(self.idle))

    async def _show_idle(self, read: Callable[[], MonthIdle]) -> None:
        """Shows under this month's dollars what its rented machines billed while nothing trained."""
        try:
            idle = await off_ui_thread(self, read)
        except (LedgerError, sqlite3.Error, OSError):
            self.month_card.show_detail("")  # the sums above say why the ledger cannot be read
            return
        self.month_card.show_detail(idle_words(idle))
        self.month_card.detail_label.setToolTip(IDLE_TIP)

    def _show_machines(self, machines: Sequence[BillingMachine], run_usd: dict[str, float]) -> None:
        keys = [machine.key for machine in machines]
        if keys != list(self.rows):
            for row in self.rows.values():
                row.deleteLater()
            self.rows = {}
            for machine in machines:
                self.rows[machine.key] = MachineRow(machine, self.sig_stop.emit)
                self.machines_box.addWidget(self.rows[machine.key])
        for machine in machines:
            self.rows[machine.key].show_machine(machine, run_usd.get(machine.run_id or ""))
        self.no_machines.setVisible(not machines)

    def on_period_changed(self) -> None:
        """Redraws the chart by month or by day."""
        if self.reading is None:
            return
        by_month = bool(self.period_combo.currentData())
        overview = self.reading.overview
        self.chart.show_periods(overview.months if by_month else overview.days, by_month=by_month)

    def stop_button(self, machine_key: str) -> QPushButton | None:
        """The Stop button of a machine shown now (for the keyboard and tests)."""
        row = self.rows.get(machine_key)
        return row.stop_button if row is not None else None
