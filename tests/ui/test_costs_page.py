"""The Costs page: the right sums per period, provider and run, the machines billing now with a Stop, an empty state,
and a chart that renders in light and in dark."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from dataclasses import asdict

import pytest
from PySide6.QtGui import QColor, QImage
from pytestqt.qtbot import QtBot

from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings, Theme
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.spend import spend_overview
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui import tray
from desktop.ui.cost_words import money
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.costs_page import CostsPage
from desktop.ui.theme import apply_theme
from tests.fixtures.recorded_costs import HOUR, SeededCosts, backdated_run, seed_spending


@pytest.fixture
def light_afterwards() -> Iterator[None]:
    yield
    apply_theme(Theme.LIGHT)


def _costs(qtbot: QtBot, qloop: asyncio.AbstractEventLoop, size: tuple[int, int] = (1280, 800)) -> CostsPage:
    window = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(window)
    window.resize(*size)
    window.show_page("costs")
    window.show()
    qtbot.waitExposed(window)
    qloop.run_until_complete(window.load_pages(follow_runs=False))
    page = window.page("costs")
    assert isinstance(page, CostsPage)
    return page


def _cells(table: object) -> list[list[str]]:
    from PySide6.QtWidgets import QTableWidget

    assert isinstance(table, QTableWidget)
    return [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]  # type: ignore[union-attr]


def test_an_empty_profile_says_what_will_appear(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> None:
    page = _costs(qtbot, qloop)
    assert page.empty.isVisible() and not page.content.isVisible()
    assert page.empty.accessibleName() == "Nothing spent yet"


def test_the_page_shows_the_sums_the_providers_the_runs_and_the_machines_billing_now(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    seeded: SeededCosts = seed_spending()
    page = _costs(qtbot, qloop)
    reading = page.reading
    assert reading is not None and page.content.isVisible() and not page.empty.isVisible()
    expected = spend_overview(RunStore(), now=reading.now)
    assert page.today_card.value_label.text() == money(expected.today_usd)
    assert page.month_card.value_label.text() == money(expected.month_usd)
    assert page.total_card.value_label.text() == money(expected.total_usd)
    assert page.burn_card.value_label.text() == "$0.94/h"
    providers = _cells(page.provider_table)
    assert [row[0] for row in providers] == ["RunPod", "Lambda", "Vast.ai", "Your servers"]
    assert providers[3][1:] == ["$7.20", f"{7.2 / expected.total_usd:.0%}"]  # 6 h at $1.20
    runs = _cells(page.run_table)
    assert len(runs) == 10 and [row[0] for row in runs[:2]] == [seeded.live_run, seeded.leftover_run], "newest first"
    live = next(row for row in runs if row[0] == seeded.live_run)
    assert live[1:4] == ["Qwen/Qwen2.5-7B-Instruct", "RunPod", "Training"] and live[5] == "$0.69/h"
    assert list(page.rows) == [f"runpod:{seeded.live_instance}", f"vast:{seeded.leftover_instance}"]
    live_row = page.rows[f"runpod:{seeded.live_instance}"]
    assert live_row.rate_label.text() == "$0.69/h" and live_row.stop_button.text() == "Stop…"
    leftover = page.rows[f"vast:{seeded.leftover_instance}"]
    assert leftover.stop_button.text() == "Terminate…" and leftover.detail_label.text().startswith("No run uses it")
    assert len(page.chart.bars) == 4, "one stack per provider"
    month_total = sum(p.usd for p in expected.months)
    legend = [page.chart.legend.itemAt(i).widget() for i in range(page.chart.legend.count() - 1)]
    assert legend and all(item is not None for item in legend)
    assert month_total == pytest.approx(expected.total_usd, abs=0.01), "every charge falls in the last 12 months"


def test_stop_on_the_page_goes_through_the_trackers_question(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = seed_spending()
    page = _costs(qtbot, qloop)
    asked: list[str] = []
    monkeypatch.setattr(tray, "confirm", lambda _p, _t, question, *_buttons: asked.append(question) or False)
    button = page.stop_button(f"runpod:{seeded.live_instance}")
    assert button is not None
    button.click()
    assert asked and f"Stop run {seeded.live_run} on RunPod RTX 4090" in asked[0]


def test_the_days_view_and_the_dark_theme_render(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, light_afterwards: None
) -> None:
    seed_spending()
    page = _costs(qtbot, qloop, (1024, 700))
    page.period_combo.setCurrentIndex(1)
    assert len(page.chart.periods) == 30 and page.chart.by_month is False
    for theme in (Theme.LIGHT, Theme.DARK):
        palette = apply_theme(theme)
        qloop.run_until_complete(asyncio.sleep(0.05))
        image = page.grab().toImage()
        colours = {image.pixel(x, y) for x in range(0, image.width(), 5) for y in range(0, image.height(), 5)}
        assert len(colours) > 20, f"the {theme.value} render looks blank"
        assert _lightness(image) < 0.35 if palette.is_dark else _lightness(image) > 0.75
        chart = page.chart.plot_widget.grab().toImage()
        corner, surface = QColor(chart.pixel(chart.width() - 4, 4)), QColor(palette.surface)
        # Within a few levels: a repaint under load may leave the corner a level off (#fefefe seen on #ffffff).
        assert max(abs(a - b) for a, b in zip(corner.getRgb(), surface.getRgb(), strict=True)) <= 4, (
            f"the chart's background follows the theme ({corner.name()} on {surface.name()})"
        )


def _lightness(image: QImage) -> float:
    values = [
        QColor(image.pixel(x, y)).lightnessF() for x in range(0, image.width(), 9) for y in range(0, image.height(), 9)
    ]
    return sum(values) / len(values)


def test_cents_are_charted_as_dollars_without_a_scale_factor(qtbot: QtBot) -> None:
    from desktop.services.billing.spend import PeriodSpend
    from desktop.ui.widgets.spend_chart import SpendChart

    chart = SpendChart()
    qtbot.addWidget(chart)
    day = 86_400.0
    chart.show_periods(
        [PeriodSpend(i * day, (i + 1) * day, {"runpod": 0.002 * (i + 1)}) for i in range(3)], by_month=False
    )
    chart.show()
    qtbot.waitExposed(chart)
    label = chart.plot_widget.getPlotItem().getAxis("left").labelString()
    assert "Dollars" in label and "(x" not in label, f"no scale such as (x0.001) beside the dollars: {label}"


def test_a_machine_says_its_own_dollars_and_the_runs_and_a_stopped_run_is_stopped(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    store, ledger, now = RunStore(), Ledger(), time.time()
    compute = asdict(ComputeSpec(provider="runpod", gpu="RTX 4090"))
    history = [(RunState.PLANNED, now - 3 * HOUR), (RunState.PROVISIONING, now - 3 * HOUR + 10)]
    live = backdated_run(store, {"compute": compute, "base_model": "m"}, [*history, (RunState.TRAINING, now - HOUR)])
    ledger.open(live, "runpod", "pod-first", "RTX 4090", 1.0, started=now - 3 * HOUR)
    ledger.close("runpod", "pod-first", stopped=now - 2 * HOUR)  # lost; the run moved to a second machine
    ledger.open(live, "runpod", "pod-second", "RTX 4090", 1.0, started=now - HOUR)
    own = [(RunState.PLANNED, now - 600), (RunState.CONNECTING, now - 590), (RunState.TRAINING, now - 500)]
    stopped = backdated_run(store, {"base_model": "m", "hourly_rate_usd": 1.0}, own, "ssh://me@box:22")
    store.transition(stopped, RunState.CANCELLED, "stopped by the user")
    page = _costs(qtbot, qloop)
    row = page.rows["runpod:pod-second"]
    # it said "Run X · $1.00 so far": the machine's dollars, as if they were the run's
    assert row.detail_label.text() == f"Run {live} · this machine $1.00 so far · the run $2.00 in all"
    states = {cells[0]: cells[3] for cells in _cells(page.run_table)}
    assert states[stopped] == "Stopped" and states[live] == "Training"  # as on the Runs page and the monitor


def _drawn_dollars(chart: object) -> list[tuple[str, float]]:
    """Each label the dollar axis draws, with the dollars the chart means at the height it is drawn at."""
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QPainter

    from desktop.ui.widgets.spend_chart import SpendChart

    assert isinstance(chart, SpendChart)
    plot = chart.plot_widget.getPlotItem()
    axis, view = plot.getAxis("left"), plot.getViewBox()
    image = QImage(10, 10, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    assert specs is not None, "the dollar axis draws nothing"
    drawn = []
    for rect, _flags, text in specs[2]:
        at = view.mapSceneToView(axis.mapToScene(QPointF(0, rect.center().y()))).y()
        drawn.append((text, at))
    return drawn


def test_dollars_are_drawn_at_their_own_height_with_dollar_ticks_in_both_themes(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, light_afterwards: None
) -> None:
    """$0.015 drew at 15 and $0.09 at about 85 once the chart was drawn again (a theme change): SI scaling of cents."""
    from desktop.services.billing.spend import PeriodSpend
    from desktop.ui.widgets.spend_chart import SpendChart

    chart = SpendChart()
    qtbot.addWidget(chart)
    chart.resize(640, 300)
    day = 86_400.0
    spending = [PeriodSpend(0.0, day, {"runpod": 0.015}), PeriodSpend(day, 2 * day, {"vast": 0.09})]
    chart.show_periods(spending, by_month=False)
    chart.show()
    qtbot.waitExposed(chart)
    for theme in (Theme.DARK, Theme.LIGHT):
        apply_theme(theme)
        qloop.run_until_complete(asyncio.sleep(0.05))
        bottom, top = chart.plot_widget.getPlotItem().getViewBox().viewRange()[1]
        assert bottom == 0 and 0.09 < top < 0.2, f"the {theme.value} chart spans $0 to a little above $0.09: {top}"
        drawn = _drawn_dollars(chart)
        assert 3 <= len(drawn) <= 12, f"a readable number of dollar ticks in {theme.value}: {drawn}"
        for text, at in drawn:
            assert text.startswith("$"), f"a dollar tick says dollars: {text!r}"
            value = float(text.removeprefix("$").replace(",", ""))
            assert value == pytest.approx(at, abs=0.01 * top), f"{text} is drawn where the chart means ${at:.4f}"
        values = sorted(float(text.removeprefix("$")) for text, _at in drawn)
        steps = {round(b - a, 6) for a, b in itertools.pairwise(values)}
        assert len(steps) == 1, f"evenly spaced ticks: {values}"


def test_this_months_dollars_say_how_much_of_them_was_paid_idle(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> None:
    from desktop.services.runs.bill import BillEvents, month_idle
    from desktop.ui.pages.costs_page import IDLE_TIP, idle_words
    from tests.fixtures.recorded_run import backdate

    store, start = RunStore(), time.time() - 1100
    run = store.create({"base_model": "x"}, None)
    for state in (RunState.PROVISIONING, RunState.TRAINING, RunState.FINISHED):
        store.transition(run.id, state)
    backdate(store, run.id, [start - 10, start, start + 100, start + 900])  # 100 s renting, 100 s after the end
    Ledger().open(run.id, "runpod", "pod-1", "RTX 4090", 36.0, started=start)
    Ledger().close("runpod", "pod-1", stopped=start + 1000)
    page = _costs(qtbot, qloop)
    assert page._idle_task is not None
    qloop.run_until_complete(page._idle_task)
    expected = month_idle(RunStore(), BillEvents())  # the same month as the page's (the machine stopped)
    assert page.month_card.detail_label.isVisible() and page.month_card.detail_label.text() == idle_words(expected)
    if expected.usd == pytest.approx(10.0):  # all of it in this month (not the first minutes of a month)
        assert idle_words(expected) == "$2.00 paid idle on rented machines (20\u00a0%)"
    assert page.month_card.detail_label.toolTip() == IDLE_TIP
    assert page.month_card.accessibleName().endswith(", " + idle_words(expected))
