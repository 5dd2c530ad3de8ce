"""Costs' Rent or buy card in the real window: hours typed, figures edited and kept, another card, the chart."""

from __future__ import annotations

import asyncio
import time

import pytest
from pytestqt.qtbot import QtBot

from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.services.billing.ledger import Ledger
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import load_settings, update_settings
from desktop.services.runs.store import RunStore
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.costs_page import CostsPage
from desktop.ui.widgets.rent_or_buy_card import FROM_RUNS, NO_HOURS, RentOrBuyCard
from tests.fixtures.recorded_run import backdate


def _card(qtbot: QtBot, qloop: asyncio.AbstractEventLoop, settings: Settings | None = None) -> RentOrBuyCard:
    window = MainWindow(settings or Settings(), SecretStore())
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.show_page("costs")
    window.show()
    qtbot.waitExposed(window)
    qloop.run_until_complete(window.load_pages(follow_runs=False))
    page = window.page("costs")
    assert isinstance(page, CostsPage) and page.rent_or_buy is not None
    _settle(qloop, page.rent_or_buy)
    return page.rent_or_buy


def _settle(qloop: asyncio.AbstractEventLoop, card: RentOrBuyCard) -> None:
    for task in (card.keep_task, card.weighing):
        if task is not None:
            qloop.run_until_complete(task)


def test_with_no_runs_it_asks_for_hours_then_weighs_them_and_keeps_every_edit(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    card = _card(qtbot, qloop)
    assert card.isVisible(), "shown before anything was spent"
    assert card.verdict_label.text() == NO_HOURS and "\u201cTraining a year\u201d" in NO_HOURS
    assert not card.chart.isVisible() and card.spins["hours_per_year"].text() == FROM_RUNS
    card.spins["hours_per_year"].setValue(500)
    _settle(qloop, card)
    assert load_settings().rent_or_buy.hours_per_year == 500, "kept in the settings"
    assert card.rent_label.text().startswith("Renting: $1,495.00 a year: 500 h of training on H100 SXM at $2.99")
    assert "Break-even:" in card.verdict_label.text() and card.chart.isVisible()
    comparison = card.report.comparison if card.report else None
    assert comparison is not None
    lines = card.chart.line_values()
    assert lines["rent"][0] == (0.0, 0.0) and lines["own"][0] == pytest.approx((0.0, comparison.card.loss_per_year_usd))
    you = [value for point in lines["you"] for value in point]
    assert you == pytest.approx([500, comparison.rent_usd(500), 500, comparison.own_usd(500)]), "on both lines"
    card.spins["price_usd"].setValue(999)
    _settle(qloop, card)
    assert card.report is not None and card.report.card.price_usd == 999
    assert load_settings().rent_or_buy.price_usd == 999
    card.card_combo.setCurrentIndex(card.card_combo.findData("rtx5090"))
    _settle(qloop, card)
    assert card.spins["price_usd"].value() == 1999, "another card comes with the table's figures"
    assert card.own_label.text().startswith("Owning an RTX 5090:")
    card.spins["kwh_usd"].setValue(0.5)
    _settle(qloop, card)
    card.reset_button.click()
    _settle(qloop, card)
    assert card.spins["kwh_usd"].value() == 0.3 and load_settings().rent_or_buy.kwh_usd is None


def test_the_last_90_days_of_runs_are_weighed_and_other_settings_never_undo_the_choice(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    store, start = RunStore(), time.time() - 7200
    run = store.create({"base_model": "x"}, None)
    for state in (RunState.PROVISIONING, RunState.TRAINING, RunState.FINISHED):
        store.transition(run.id, state)
    backdate(store, run.id, [start - 1, start, start + 1800, start + 5400])  # 30 min setup, 1 h training
    Ledger().open(run.id, "runpod", "pod-1", "H100 SXM", 3.0, started=start)
    Ledger().close("runpod", "pod-1", stopped=start + 7200)
    card = _card(qtbot, qloop)
    assert "at $6.00 a training hour (paid idle included)" in card.rent_label.text(), "$6 for an hour of training"
    assert "Your runs trained 1.0 h in the last 90 days" in card.notes_label.text()
    card.rent_combo.setCurrentIndex(card.rent_combo.findData("a100-80gb"))
    _settle(qloop, card)
    assert "on A100 80GB at $" in card.rent_label.text() and "(list price, no idle counted)" in card.rent_label.text()
    update_settings({"theme": "dark"})  # the Settings page saves only its own preferences
    assert load_settings().rent_or_buy.rent_gpu == "a100-80gb"
