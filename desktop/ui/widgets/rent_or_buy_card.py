"""Costs' "Rent or buy" card: renting against owning a card, with the card's figures to edit.

It shows what a year of each costs, the break-even hours and a chart of both against hours a year.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QGridLayout, QHBoxLayout, QLabel

from desktop.core.costs.rent_or_buy import HISTORY_DAYS, HOURS_PER_YEAR, RentOrBuy
from desktop.core.settings import RentOrBuyChoice, SettingsError
from desktop.services.billing.ledger import LedgerError
from desktop.services.runs.rent_or_buy import DEFAULT_RENTED_NAME, RentOrBuyError, RentOrBuyReport
from desktop.ui.background import off_ui_thread, spawn
from desktop.ui.cost_words import money, upper_first
from desktop.ui.widgets.blocks import Card, caption, plain_button
from desktop.ui.widgets.rent_or_buy_chart import RentOrBuyChart

SUBTITLE = (
    "A year of renting as you rent, every paid idle minute included, against owning a card. A slower card trains "
    "longer for the same work, and those hours are its electricity."
)
#: The fields of the choice a spin box edits: (field, label, unit, lowest, highest, decimals).
_FIELDS = (
    ("price_usd", "Price", "$", 0.0, 1_000_000.0, 0),
    ("watts", "Power while training", "W", 1.0, 10_000.0, 0),
    ("kwh_usd", "Electricity", "$/kWh", 0.0, 5.0, 2),
    ("resale_percent", "Resale value", "%", 0.0, 100.0, 0),
    ("years", "Kept for", "years", 0.5, 20.0, 1),
    ("hours_per_year", "Training a year", "h", 0.0, 100_000.0, 0),
)
FROM_RUNS = "From your runs"
NO_HOURS = (
    f"No rented training in the last {HISTORY_DAYS} days: type the hours of training you expect a year in "
    f"\u201cTraining a year\u201d to compare with renting an {DEFAULT_RENTED_NAME} at its list price (or choose "
    "another GPU type under \u201cRenting\u201d)."
)
AS_RENTED = "As you rented (last 90 days)"


def rent_words(comparison: RentOrBuy) -> str:
    """What a year of renting costs, and what the hourly figure is."""
    rented, hours = comparison.rented, comparison.rented.hours_per_year
    where = ", ".join(rented.gpu_names)
    basis = "paid idle included" if rented.history_hours is not None else "list price, no idle counted"
    return (
        f"Renting: {money(comparison.rent_usd(hours))} a year: {hours:,.0f} h of training on {where} at "
        f"{money(rented.usd_per_training_hour)} a training hour ({basis})."
    )


def own_words(comparison: RentOrBuy) -> str:
    """What a year of owning costs: lost value and electricity, and the hours the card needs."""
    card, hours = comparison.card, comparison.rented.hours_per_year
    electricity = hours * comparison.owned_usd_per_rented_hour
    yearly = money(comparison.own_usd(hours))
    return (
        f"{upper_first(card.owning_words)}: {yearly} a year: {money(card.loss_per_year_usd)} of lost value and"
        f" {money(electricity)} of electricity for {comparison.owned_hours_per_year:,.0f} h "
        f"({comparison.hours_factor:.2f}\u00d7 the rented hours: its speed against theirs)."
    )


def verdict_words(comparison: RentOrBuy) -> str:
    """Which is cheaper at the user's hours, by how much, and the break-even."""
    hours = comparison.rented.hours_per_year
    gap = money(abs(comparison.rent_usd(hours) - comparison.own_usd(hours)))
    doing = comparison.card.doing
    cheaper = f"{upper_first(doing) if comparison.owning_is_cheaper else 'Renting'} is cheaper by {gap} a year."
    even = comparison.break_even_hours
    if even is None:
        return (
            f"{cheaper} {upper_first(doing)} never pays back: an hour of its electricity costs more than a rented hour."
        )
    return f"{cheaper} Break-even: {even:,.0f} h of rented training a year; above it {doing} costs less."


def note_words(report: RentOrBuyReport, comparison: RentOrBuy) -> str:
    """What to keep in mind: memory, a year's hours, left-out runs, where speeds and figures come from."""
    card, notes = comparison.card, []
    if comparison.rented.vram_gib > card.gpu.vram_gib:
        notes.append(
            f"{upper_first(card.subject)} has {card.gpu.vram_gib:g} GB; the GPUs rented had "
            f"{comparison.rented.vram_gib:g} GB: jobs that need more will not fit on it."
        )
    if not comparison.fits_in_a_year:
        hours = comparison.owned_hours_per_year
        notes.append(f"{upper_first(card.subject)} alone cannot train {hours:,.0f} h: a year has {HOURS_PER_YEAR:,}.")
    if report.left_out:
        runs = "1 run on a GPU type" if report.left_out == 1 else f"{report.left_out} runs on GPU types"
        notes.append(f"{runs} Rentune does not know {'is' if report.left_out == 1 else 'are'} left out.")
    if comparison.rented.history_hours is not None:
        notes.append(
            f"Your runs trained {comparison.rented.history_hours:,.1f} h in the last {HISTORY_DAYS} days, "
            "counted as a year."
        )
    measured = f" Measured on your runs: {', '.join(report.measured)}." if report.measured else ""
    notes.append(f"Speeds: the GPU catalog's planning figures.{measured} Card figures: {card.source}")
    return " ".join(notes)


class RentOrBuyCard(Card):
    """Renting against owning one card, with the card's figures to edit; every edit is kept in the settings.

    Args:
        weigh: Reads the comparison for a choice (blocking; run off the UI thread).
        keep: Saves a choice (blocking; run off the UI thread).
        choice: The choice last kept.
    """

    def __init__(
        self,
        weigh: Callable[[RentOrBuyChoice], RentOrBuyReport],
        keep: Callable[[RentOrBuyChoice], object],
        choice: RentOrBuyChoice,
    ) -> None:
        super().__init__("Rent or buy", SUBTITLE)
        self.weigh, self.keep, self.choice = weigh, keep, choice
        self.report: RentOrBuyReport | None = None
        self._task: asyncio.Task[None] | None = None
        self.keep_task: asyncio.Task[None] | None = None
        self._again = False
        self._filling = False
        self.card_combo, self.rent_combo = QComboBox(), QComboBox()
        self.card_combo.setAccessibleName("Card to weigh against renting")
        self.rent_combo.setAccessibleName("What renting means")
        self.spins: dict[str, QDoubleSpinBox] = {}
        self.body.addLayout(self._build_form())
        self.rent_label, self.own_label, self.verdict_label = QLabel(), QLabel(), QLabel()
        for label in (self.rent_label, self.own_label, self.verdict_label):
            label.setWordWrap(True)
            self.body.addWidget(label)
        font = self.verdict_label.font()
        font.setBold(True)
        self.verdict_label.setFont(font)
        self.chart = RentOrBuyChart()
        self.body.addWidget(self.chart)
        self.notes_label = caption()
        self.notes_label.setWordWrap(True)
        self.body.addWidget(self.notes_label)

    def _build_form(self) -> QGridLayout:
        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        grid.addWidget(QLabel("Card"), 0, 0)
        grid.addWidget(self.card_combo, 0, 1)
        grid.addWidget(QLabel("Renting"), 0, 2)
        grid.addWidget(self.rent_combo, 0, 3)
        for index, (field, label, unit, low, high, decimals) in enumerate(_FIELDS):
            spin = QDoubleSpinBox()
            spin.setRange(low, high)
            spin.setDecimals(decimals)
            spin.setSuffix(f" {unit}" if unit != "$" else "")
            spin.setPrefix("$" if unit == "$" else "")
            spin.setGroupSeparatorShown(True)
            spin.setKeyboardTracking(False)  # one comparison per edit, not per digit typed
            spin.setAccessibleName(f"{label} ({unit})")
            spin.valueChanged.connect(lambda _value, name=field: self.on_figure_edited(name))
            self.spins[field] = spin
            row, column = 1 + index // 2, (index % 2) * 2
            grid.addWidget(QLabel(label), row, column)
            grid.addWidget(spin, row, column + 1)
        self.spins["hours_per_year"].setSpecialValueText(FROM_RUNS)  # 0: the last 90 days, extrapolated
        reset = plain_button("Use the table's figures", "eraser", "Use the cards table's figures for this card")
        reset.clicked.connect(self.on_reset_clicked)
        self.reset_button = reset
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(reset)
        grid.addLayout(buttons, 4, 0, 1, 4)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        self.card_combo.currentIndexChanged.connect(self.on_card_chosen)
        self.rent_combo.currentIndexChanged.connect(self.on_rent_chosen)
        return grid

    # -- reading -----------------------------------------------------------------------------------------------------

    @property
    def weighing(self) -> asyncio.Task[None] | None:
        """The comparison being read now (None, or done, when none is)."""
        return self._task

    def refresh(self) -> None:
        """Weighs the current choice again (off the UI thread); edits made meanwhile are weighed after it."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = spawn(self._weigh())

    async def _weigh(self) -> None:
        while True:
            self._again = False
            choice = self.choice
            try:
                report = await off_ui_thread(self, self.weigh, choice)
            except (RentOrBuyError, LedgerError, SettingsError, sqlite3.Error, OSError) as exc:
                self._show_problem(str(exc))
            else:
                self.show_report(report)
            if not self._again:
                return

    def show_report(self, report: RentOrBuyReport) -> None:
        """Shows the comparison (or what is missing for one) and the figures it used."""
        self.report = report
        self._fill(report)
        comparison = report.comparison
        self.chart.setVisible(comparison is not None)
        if comparison is None:
            self._show_problem(NO_HOURS)
            return
        self.rent_label.setText(rent_words(comparison))
        self.own_label.setText(own_words(comparison))
        self.verdict_label.setText(verdict_words(comparison))
        self.notes_label.setText(note_words(report, comparison))
        for label in (self.rent_label, self.own_label):
            label.show()
        self.chart.show_comparison(comparison)

    def _show_problem(self, words: str) -> None:
        self.rent_label.hide()
        self.own_label.hide()
        self.chart.hide()
        self.verdict_label.setText(words)
        self.notes_label.setText("")

    def _fill(self, report: RentOrBuyReport) -> None:
        """Puts the figures used in the fields, without taking them as edits."""
        self._filling = True
        try:
            if self.card_combo.count() != len(report.table.cards):
                self.card_combo.clear()
                for card in report.table.cards:
                    self.card_combo.addItem(card.name, card.id)
            self.card_combo.setCurrentIndex(max(0, self.card_combo.findData(report.card.id)))
            kwh = report.comparison.kwh_usd if report.comparison else report.table.kwh_usd
            hours = self.choice.hours_per_year or 0.0
            shown = {"price_usd": report.card.price_usd, "watts": report.card.watts, "kwh_usd": kwh}
            shown |= {"resale_percent": report.card.resale_percent, "years": report.card.years, "hours_per_year": hours}
            for field, value in shown.items():
                self.spins[field].setValue(value)
        finally:
            self._filling = False

    def fill_rent_choices(self, gpus: list[tuple[str, str]]) -> None:
        """Offers renting as the user rented, or each GPU type ``(id, name)`` at its list price."""
        self._filling = True
        try:
            self.rent_combo.clear()
            self.rent_combo.addItem(AS_RENTED, None)
            for gpu_id, name in gpus:
                self.rent_combo.addItem(f"{name} at its list price", gpu_id)
            self.rent_combo.setCurrentIndex(max(0, self.rent_combo.findData(self.choice.rent_gpu)))
        finally:
            self._filling = False

    # -- editing -----------------------------------------------------------------------------------------------------

    def on_figure_edited(self, field: str) -> None:
        """Takes a typed figure (0 hours: from the runs) into the choice, keeps it and weighs again."""
        if self._filling:
            return
        value: float | None = self.spins[field].value()
        if field == "hours_per_year" and not value:
            value = None
        self._choose(**{field: value})

    def on_card_chosen(self) -> None:
        """Weighs another card at the table's figures (the edits belonged to the card before)."""
        if self._filling:
            return
        self._choose(card=self.card_combo.currentData(), price_usd=None, watts=None, resale_percent=None, years=None)

    def on_rent_chosen(self) -> None:
        """Weighs against renting as the user rented, or a GPU type at its list price."""
        if not self._filling:
            self._choose(rent_gpu=self.rent_combo.currentData())

    def on_reset_clicked(self) -> None:
        """Forgets the edits of this card's figures and the electricity price."""
        self._choose(price_usd=None, watts=None, resale_percent=None, years=None, kwh_usd=None)

    def _choose(self, **changes: Any) -> None:
        self.choice = self.choice.model_copy(update=changes)
        self.keep_task = spawn(self._keep(self.choice))
        self.refresh()

    async def _keep(self, choice: RentOrBuyChoice) -> None:
        try:
            await off_ui_thread(self, self.keep, choice)
        except (SettingsError, OSError) as exc:
            self.notes_label.setText(f"Your figures could not be kept: {exc}")
