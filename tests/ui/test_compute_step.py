"""The Compute step against the fake clouds served over HTTP: live offers judged for the run, the cheapest that fits
picked, filters, the budget, keys added inline (checked, kept in the keyring, masked) and refusals in words."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import run_spec_from_dict
from desktop.core.settings import Settings, Theme
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.providers.base import ProviderName
from desktop.ui.context import AppContext
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.wizard.compute_step import ComputeStep
from desktop.ui.pages.wizard.model_step import ModelStep
from desktop.ui.pages.wizard.review_step import ReviewStep
from desktop.ui.pages.wizard.wizard_page import WizardPage
from desktop.ui.theme import apply_theme
from desktop.ui.widgets.offers_table import KIND_COLUMN
from tests.fakes.http import FakeCloud
from tests.fixtures.memory_keyring import MemoryKeyring

RUNPOD, VAST, LAMBDA = ProviderName.RUNPOD, ProviderName.VAST, ProviderName.LAMBDA


@pytest.fixture
def clouds(
    fake_runpod: FakeCloud, fake_vast: FakeCloud, fake_lambda: FakeCloud, monkeypatch: pytest.MonkeyPatch
) -> dict[ProviderName, FakeCloud]:
    """The three fake clouds served; RunPod and Vast.ai have keys in the environment, Lambda has none."""
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", fake_runpod.serve())
    monkeypatch.setenv("RENTUNE_VAST_URL", fake_vast.serve() + "/api/v0")
    monkeypatch.setenv("RENTUNE_LAMBDA_URL", fake_lambda.serve() + "/api/v1")
    monkeypatch.setenv("RUNPOD_API_KEY", fake_runpod.valid_key)
    monkeypatch.setenv("VAST_API_KEY", fake_vast.valid_key)
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    return {RUNPOD: fake_runpod, VAST: fake_vast, LAMBDA: fake_lambda}


def open_step(qtbot: QtBot, draft: RunDraft) -> ComputeStep:
    step = ComputeStep(AppContext(Settings(), SecretStore(), draft=draft))
    qtbot.addWidget(step)
    step.resize(1100, 900)
    step.show()
    step.show_draft()
    return step


def offers_shown(step: ComputeStep, wait_for: Callable[..., None]) -> None:
    wait_for(lambda: not step.fetching and step.judged is not None, 40)


@pytest.fixture
def step(
    clouds: dict[ProviderName, FakeCloud], qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> ComputeStep:
    # A 7 B model in LoRA: too big for a 24 GB card, fine on 80 GB (and on two 3090s sharing it).
    widget = open_step(qtbot, RunDraft(base_model="qwen2.5-7b", method="lora"))
    assert widget.fetching and widget.progress.isVisibleTo(widget), "asking shows progress, the page stays usable"
    assert not widget.refresh_button.isEnabled()
    offers_shown(widget, wait_for)
    return widget


def test_offers_of_every_keyed_provider_are_judged_and_the_cheapest_that_fits_is_picked(step: ComputeStep) -> None:
    assert not step.progress.isVisibleTo(step) and step.refresh_button.isEnabled()
    rows = step.keys_panel.rows
    assert rows[RUNPOD].badge.text() == "8 offers" and rows[VAST].badge.text() == "6 offers"
    assert "RUNPOD_API_KEY" in rows[RUNPOD].words.text() and "test-key" not in rows[RUNPOD].words.text()
    assert rows[LAMBDA].badge.text() == "No key" and rows[LAMBDA].key_button.text() == "Add key"
    assert "No Lambda API key yet" in rows[LAMBDA].words.text()
    shown = step.offers.items
    assert {item.offer.provider for item in shown} == {RUNPOD, VAST}
    assert all(not item.offer.spot for item in shown), "on-demand only until the user asks for spot"
    cheapest = min((i for i in shown if i.fits), key=lambda i: i.total_usd or 0.0)
    assert step.pick is not None and step.pick.key == cheapest.key
    assert step.offers.selected() is step.pick
    assert step.pick.offer.gpu == "A100 SXM4" and step.pick.offer.provider is VAST
    table = step.offers.table
    assert table.item(0, 1).text() == "A100 SXM4 · 80 GiB" and table.item(0, 4).text() == f"${cheapest.total_usd:,.2f}"
    assert "Vast.ai: 1 x A100 SXM4 (80 GiB), on-demand" in step.pick_label.text()
    assert step.validate() is None


def test_the_pick_becomes_the_specs_compute_section(step: ComputeStep, tmp_path: Path) -> None:
    draft = RunDraft(base_model="qwen2.5-7b", method="lora", train_file=str(tmp_path / "train.jsonl"))
    step.python_edit.setText("/opt/conda/bin/python")
    step.save_into(draft)
    assert draft.renting and draft.compute.picked
    spec = run_spec_from_dict(draft.spec_dict(), tmp_path)
    pick = step.pick
    assert pick is not None and spec.compute is not None and spec.target is None
    assert (spec.compute.provider, spec.compute.gpu, spec.compute.count) == ("vast", "A100 SXM4", 1)
    assert spec.compute.offer == pick.offer.offer_id and not spec.compute.spot
    assert spec.compute.max_price_per_hour == pytest.approx(round(pick.offer.price_per_hour * 1.1, 2), abs=0.011)
    assert spec.compute.python == "/opt/conda/bin/python"
    assert spec.training["num_gpus"] == 1


def test_filters_narrow_the_table_and_move_the_pick_only_when_it_is_filtered_out(step: ComputeStep) -> None:
    before = step.pick
    step.fits_check.setChecked(True)
    assert all(item.fits for item in step.offers.items) and step.pick is before
    step.provider_combo.setCurrentIndex(step.provider_combo.findData(RUNPOD.value))
    assert {item.offer.provider for item in step.offers.items} == {RUNPOD}
    assert step.pick is not None and step.pick.offer.provider is RUNPOD, "the cheapest that fits at RunPod"
    step.kind_combo.setCurrentIndex(step.kind_combo.findData(True))
    assert step.offers.items and all(item.offer.spot for item in step.offers.items)
    assert step.pick is not None and step.pick.offer.spot
    step.price_spin.setValue(0.7)
    assert all(item.offer.price_per_hour <= 0.7 for item in step.offers.items)
    step.price_spin.setValue(0.1)
    assert step.offers.items == [] and step.pick is None
    assert step.empty.isVisibleTo(step) and step.empty_title.text() == "No offer passes the filters"
    assert "Pick an offer" in (step.validate() or "")


def test_a_machine_of_several_gpus_carries_its_count_and_strategy_into_the_spec(
    step: ComputeStep, tmp_path: Path
) -> None:
    step.kind_combo.setCurrentIndex(step.kind_combo.findData(None))
    row = next(i for i, item in enumerate(step.offers.items) if item.offer.count == 2 and item.fits)
    step.offers.table.selectRow(row)
    pick = step.pick
    assert pick is not None and pick.offer.count == 2 and pick.offer.gpu == "RTX 3090"
    draft = RunDraft(base_model="qwen2.5-7b", method="lora", train_file=str(tmp_path / "train.jsonl"))
    step.save_into(draft)
    spec = run_spec_from_dict(draft.spec_dict(), tmp_path)
    assert spec.training["num_gpus"] == 2 and spec.training["strategy"] == pick.strategy
    assert spec.compute is not None and spec.compute.count == 2


def test_the_budget_is_compared_with_the_estimate_and_saved(step: ComputeStep) -> None:
    assert "No budget" in step.budget_label.text()
    pick = step.pick
    assert pick is not None and pick.total_usd is not None
    step.budget_spin.setValue(round(pick.total_usd / 2, 2))
    assert step.budget_banner.isVisibleTo(step) and "above the budget" in step.budget_banner.headline_label.text()
    step.budget_spin.setValue(round(pick.total_usd * 2, 2))
    assert not step.budget_banner.isVisibleTo(step) and "is within it" in step.budget_label.text()
    draft = RunDraft()
    step.save_into(draft)
    assert draft.budget_usd == round(pick.total_usd * 2, 2) and draft.spec_dict()["budget"] == {
        "max_usd": draft.budget_usd
    }


def test_a_key_added_inline_is_checked_kept_masked_and_brings_its_offers(
    step: ComputeStep,
    clouds: dict[ProviderName, FakeCloud],
    qtbot: QtBot,
    wait_for: Callable[..., None],
    memory_keyring: MemoryKeyring,
) -> None:
    clouds[LAMBDA].valid_key = "secret_lambda_0123456789abcd"  # type: ignore[misc]
    row = step.keys_panel.rows[LAMBDA]
    assert not row.editor.isVisibleTo(step)
    row.key_button.click()
    assert row.editor.isVisibleTo(step) and row.key_edit.echoMode() == row.key_edit.EchoMode.Password
    qtbot.keyClicks(row.key_edit, "not-the-key-at-all")
    row.save_button.click()
    wait_for(row.save_button.isEnabled, 20)
    assert row.error.headline_label.text() == "The key was not saved"
    assert row.error.details_label.text().startswith("Lambda refused this key.")
    assert "cloud.lambda.ai" in row.error.details_label.text() and "rentune" not in row.error.details_label.text()
    assert SecretStore().get(SecretName.LAMBDA) is None, "a refused key is never stored"
    row.key_edit.setText("secret_lambda_0123456789abcd")
    qtbot.keyClick(row.key_edit, Qt.Key.Key_Return)
    wait_for(lambda: step.keys_panel.rows[LAMBDA].key is not None and step.keys_panel.rows[LAMBDA].key.present, 20)
    assert not row.editor.isVisibleTo(step) and row.key_edit.text() == ""
    assert ("rentune", "lambda") in memory_keyring.passwords, "kept in the keyring"
    offers_shown(step, wait_for)
    assert row.badge.text().endswith("offers") and "0123456789" not in row.words.text()
    assert "Key ••••abcd, in the keyring." in row.words.text()
    assert LAMBDA in {item.offer.provider for item in step.judged.offers}  # type: ignore[union-attr]
    assert row.key_button.text() == "Replace key"


def test_a_refused_stored_key_says_so_and_opens_the_key_field(
    clouds: dict[ProviderName, FakeCloud], qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    clouds[RUNPOD].faults.reject_key = True
    step = open_step(qtbot, RunDraft(base_model="qwen2.5-7b", method="qlora"))
    offers_shown(step, wait_for)
    row = step.keys_panel.rows[RUNPOD]
    assert row.badge.text() == "Key refused"
    assert "RunPod refused the stored key" in row.words.text() and "rentune" not in row.words.text()
    assert {item.offer.provider for item in step.judged.offers} == {VAST}  # type: ignore[union-attr]


def test_without_any_key_the_step_says_how_to_get_offers(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("RUNPOD_API_KEY", "VAST_API_KEY", "LAMBDA_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    step = open_step(qtbot, RunDraft(base_model="qwen2.5-7b"))
    offers_shown(step, wait_for)
    assert all(row.badge.text() == "No key" for row in step.keys_panel.rows.values())
    assert step.empty.isVisibleTo(step) and step.empty_title.text() == "Add an API key to see offers"
    problem = step.validate()
    assert problem is not None and "Add a provider's API key" in problem and "Your own server" in problem


def test_a_model_that_cannot_be_sized_still_lists_offers_unjudged(
    clouds: dict[ProviderName, FakeCloud], qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    step = open_step(qtbot, RunDraft())
    offers_shown(step, wait_for)
    assert step.offers_banner.headline_label.text() == "The offers cannot be judged for this run"
    assert step.offers_banner.isVisibleTo(step) and "Choose a base model" in step.offers_banner.details_label.text()
    assert step.offers.items and all(item.fit is None for item in step.offers.items)
    assert step.pick is None, "nothing is known to fit: the user picks"
    assert step.offers.table.cellWidget(0, 2).accessibleName() == "Unknown"


def test_switching_to_the_own_server_hides_the_offers_and_keeps_the_pick_for_later(step: ComputeStep) -> None:
    pick = step.pick
    step.own_button.click()
    assert not step.rent_panel.isVisibleTo(step) and step.own_form.isVisibleTo(step)
    assert step.validate() == "Enter the server's host name or address."
    draft = RunDraft()
    step.save_into(draft)
    assert not draft.renting and draft.compute.offer_id == pick.offer.offer_id  # type: ignore[union-attr]
    step.rent_button.click()
    assert step.rent_panel.isVisibleTo(step) and step.pick is pick


def test_when_no_machine_fits_nothing_is_picked_and_the_step_says_why(
    clouds: dict[ProviderName, FakeCloud], qtbot: QtBot, wait_for: Callable[..., None]
) -> None:
    # a full fine-tune of a 70 B model: terabytes per GPU, no offer comes near; a pick saved before must not stay
    remembered = RunDraft(base_model="qwen2.5-7b", method="lora")
    earlier = open_step(qtbot, remembered)
    offers_shown(earlier, wait_for)
    earlier.save_into(remembered)
    assert remembered.compute.picked
    step = open_step(qtbot, remembered.model_copy(update={"base_model": "llama-3.1-70b", "method": "full"}))
    offers_shown(step, wait_for)
    assert step.judged is not None and step.judged.offers and not any(item.fits for item in step.judged.offers)
    assert step.pick is None and step.offers.selected() is None  # it picked a 1 x RTX 3090 and showed its total
    assert step.pick_label.text().startswith("Nothing picked: no machine offered fits this run"), "no 'pick a row'"
    assert step.offers_banner.headline_label.text() == "No machine offered fits this run"
    details = step.offers_banner.details_label.text()
    assert "GiB per GPU even on the closest" in details and "QLoRA" in details and "on the Sizing step" in details
    assert step.shown_label.text().endswith("offers, by price: none fits.")
    table = step.offers.table
    times_and_totals = {(table.item(r, 3).text(), table.item(r, 4).text()) for r in range(table.rowCount())}
    assert times_and_totals == {("does not fit", "—")}
    assert step.validate() is not None  # Next asks for a machine


def test_a_pick_remembered_from_before_that_is_gone_or_repriced_is_said_not_swapped_silently(
    clouds: dict[ProviderName, FakeCloud], qtbot: QtBot, wait_for: Callable[..., None]
) -> None:
    draft = RunDraft(base_model="qwen2.5-7b", method="lora")
    first = open_step(qtbot, draft)
    offers_shown(first, wait_for)
    first.save_into(draft)
    picked = draft.compute.model_copy()
    # the app reopened: the offer's price moved meanwhile
    draft.compute = picked.model_copy(update={"price_per_hour": picked.price_per_hour - 0.10})
    repriced = open_step(qtbot, draft)
    offers_shown(repriced, wait_for)
    assert repriced.pick is not None and repriced.pick.offer.offer_id == picked.offer_id
    was = picked.price_per_hour - 0.10
    assert repriced.pick_label.text().startswith(
        f"Your earlier pick now costs ${picked.price_per_hour:,.2f}/h (it was ${was:,.2f}/h)."
    )
    # ... or the machine is gone: another is picked, and the line says why
    draft.compute = picked.model_copy(update={"offer_id": "no-longer-there"})
    gone = open_step(qtbot, draft)
    offers_shown(gone, wait_for)
    assert gone.pick_label.text().startswith("Your earlier pick, 1 x A100 SXM4 (80 GiB) at $")
    assert "is no longer offered." in gone.pick_label.text() and gone.pick is not None


def test_at_1024_pixels_every_offers_location_shows_whole(
    clouds: dict[ProviderName, FakeCloud],
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
) -> None:
    apply_theme(Theme.LIGHT)  # as the app draws it: the stylesheet's bold, padded headers widen their columns
    context = AppContext(Settings(), SecretStore(), draft=RunDraft(base_model="qwen2.5-7b", method="lora"))
    window = MainWindow(Settings(), SecretStore(), context)
    qtbot.addWidget(window)
    window.resize(1024, 700)
    window.show()
    qloop.run_until_complete(window.load_pages())
    window.show_page("compute")
    step = window.wizard.step("compute")
    assert isinstance(step, ComputeStep)
    offers_shown(step, wait_for)
    table = step.offers.table
    location = table.columnCount() - 1
    assert table.isColumnHidden(KIND_COLUMN)  # on-demand only: every row would say the same
    assert table.columnWidth(location) >= table.sizeHintForColumn(location), "no place is cut to 'commu…'"
    assert table.horizontalScrollBar().maximum() == 0
    step.kind_combo.setCurrentIndex(step.kind_combo.findData(None))
    assert not table.isColumnHidden(KIND_COLUMN)


def compute_wizard(qtbot: QtBot, draft: RunDraft) -> tuple[WizardPage, ComputeStep]:
    """The Compute step in the wizard between the real Model and Review steps (Enter used to go on to Review)."""
    draft.step = "compute"
    context = AppContext(Settings(), SecretStore(), draft=draft)
    step = ComputeStep(context)
    wizard = WizardPage(context, [ModelStep(context), step, ReviewStep(context)])
    qtbot.addWidget(wizard)
    wizard.resize(1100, 700)
    wizard.show()
    wizard.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is wizard)
    return wizard, step


@pytest.mark.parametrize(
    ("field", "note", "name", "now"),
    [("price_spin", "price_note", "Max price", "Any price"), ("budget_spin", "budget_note", "Budget", "No limit")],
)
def test_enter_in_a_filter_or_the_budget_stays_on_the_step_and_quotes_what_was_typed(
    clouds: dict[ProviderName, FakeCloud],
    qtbot: QtBot,
    wait_for: Callable[..., None],
    field: str,
    note: str,
    name: str,
    now: str,
) -> None:
    # Enter in Max price went on to Review without a word, and the message quoted "-" for "-5".
    wizard, step = compute_wizard(qtbot, RunDraft(base_model="qwen2.5-7b", method="lora"))
    offers_shown(step, wait_for)
    assert step.pick is not None, "the step is complete: Enter elsewhere would go on"
    box = getattr(step, field)
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    box.selectAll()
    qtbot.keyClicks(box, "-5")
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert wizard.current is step, "Enter in a number field takes the number; it never leaves the step"
    assert box.value() == 0 and box.text() == now
    said = getattr(step, note)
    assert said.isVisible() and said.text().startswith(f"{name}: “-5” is below the lowest it takes, so it stays {now}.")
    assert "Type a number from 0.00 to" in said.text()
    assert box.hasFocus()
    for combo in (step.provider_combo, step.kind_combo):
        combo.setFocus()
        qtbot.waitUntil(combo.hasFocus)
        qtbot.keyClick(combo, Qt.Key.Key_Return)
        assert wizard.current is step, "Enter in a filter never leaves the step"


def test_next_when_no_machine_fits_keeps_the_reason_in_view_and_says_what_to_change(
    clouds: dict[ProviderName, FakeCloud], qtbot: QtBot, wait_for: Callable[..., None]
) -> None:
    # Next replaced the reason with "Pick an offer in the table (widen the filters…)", scrolled out of view.
    wizard, step = compute_wizard(qtbot, RunDraft(base_model="llama-3.1-70b", method="full"))
    offers_shown(step, wait_for)
    assert step.pick is None
    wizard.next_button.click()
    assert wizard.current is step
    shown = [label.text() for label in step.findChildren(QLabel) if label.isVisibleTo(step)]
    assert not any("Pick an offer" in text for text in shown), shown
    assert wizard.problem_label.text() == "No machine offered fits this run"
    problem = step.shown_problem
    assert problem is not None and "Make the run smaller on the Model step" in problem.details
    assert "choose several GPUs on the Sizing step" in problem.details
    assert problem.step == "model" and step.problem_action.isVisibleTo(step), "a button goes to the Model step"
    assert step.problem_banner.visibleRegion().boundingRect().height() == step.problem_banner.height()
    offers_reason = step.offers_banner
    assert offers_reason.isVisibleTo(step) and offers_reason.headline_label.text() == "No machine offered fits this run"
    assert "GiB per GPU even on the closest" in offers_reason.details_label.text(), "the reason with its numbers stays"
    assert not offers_reason.visibleRegion().isEmpty(), "the reason beside the offers is scrolled into view"
    step.problem_action.click()
    model = wizard.current
    assert isinstance(model, ModelStep) and model.method_buttons[model.method].hasFocus()
