"""The wizard's model step on the real bundled catalog: filtering, choosing, methods and the advanced settings."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import DEFAULT_TRAINING, RunDraft
from desktop.core.settings import Settings
from desktop.services.models.configs import load_catalog
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.design.palette import METRICS
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.wizard.model_step import METHODS, TRAINING_FIELDS, ModelStep
from desktop.ui.widgets.blocks import install_wheel_guard
from tests.fixtures.qt_input import type_and_leave, wheel
from trainer_payload.protocol import JOB_INT_RANGES


@pytest.fixture
def context() -> AppContext:
    return AppContext(Settings(), SecretStore())


@pytest.fixture
def step(qtbot: QtBot, qloop: asyncio.AbstractEventLoop, context: AppContext) -> ModelStep:
    gc.collect()
    widget = ModelStep(context)
    qtbot.addWidget(widget)
    widget.resize(1100, 700)
    widget.show()
    qtbot.waitExposed(widget)
    qloop.run_until_complete(widget.load())
    widget.show_draft()
    return widget


def test_catalog_is_listed_and_the_filter_narrows_it(step: ModelStep, qtbot: QtBot) -> None:
    catalog = load_catalog()
    assert step.catalog_table.rowCount() == len(catalog)
    assert len(step.visible_models()) == len(catalog)
    qtbot.keyClicks(step.filter_edit, "qwen 7b")
    visible = step.visible_models()
    assert "Qwen/Qwen2.5-7B-Instruct" in visible
    assert "meta-llama/Llama-3.1-8B-Instruct" not in visible
    assert all("qwen" in model.lower() for model in visible)
    assert 0 < len(visible) < len(catalog)
    step.filter_edit.clear()
    qtbot.keyClicks(step.filter_edit, "gemma")  # the licence column counts too
    assert all("gemma" in model for model in step.visible_models())
    step.filter_edit.clear()
    assert len(step.visible_models()) == len(catalog)


def test_catalog_row_shows_size_context_and_licence_and_picking_it_sets_the_model(step: ModelStep) -> None:
    table = step.catalog_table
    row = next(r for r in range(table.rowCount()) if table.item(r, 0).text() == "Qwen/Qwen2.5-7B-Instruct")
    assert [table.item(row, c).text() for c in range(1, 5)] == ["Qwen 2.5", "7.6 B", "32,768", "apache-2.0"]
    moe = next(r for r in range(table.rowCount()) if table.item(r, 0).text() == "Qwen/Qwen3-30B-A3B")
    assert "active" in table.item(moe, 2).text()
    gemma = next(r for r in range(table.rowCount()) if table.item(r, 0).text() == "google/gemma-3-1b-it")
    assert table.item(gemma, 2).text() == "1.0 B", "999,812,736 parameters read 1000 M"
    assert "Choose a model" in (step.validate() or "")
    table.selectRow(row)
    assert step.model_edit.text() == "Qwen/Qwen2.5-7B-Instruct"
    assert step.validate() is None
    draft = RunDraft()
    step.save_into(draft)
    assert draft.base_model == "Qwen/Qwen2.5-7B-Instruct"


def test_a_model_folder_too_long_for_the_field_is_whole_in_its_tooltip(step: ModelStep, qtbot: QtBot) -> None:
    folder = "/home/alexandra/models/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/12fd25f7"
    step.model_edit.setFocus()
    qtbot.keyClicks(step.model_edit, folder)
    assert step.model_edit.toolTip() == folder
    step.model_edit.setText("Qwen/Qwen2.5-7B-Instruct")
    assert step.model_edit.toolTip() == ""


def test_typed_models_are_checked(step: ModelStep, qtbot: QtBot, tmp_path: Path) -> None:
    model_folder = tmp_path / "my-model"
    model_folder.mkdir()
    (model_folder / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    qtbot.keyClicks(step.model_edit, "llama-3.1-8b")  # an alias selects its catalog row
    assert step.catalog_table.selectedItems()[0].text() == "meta-llama/Llama-3.1-8B-Instruct"
    assert step.validate() is None
    step.model_edit.clear()
    qtbot.keyClicks(step.model_edit, "someorg/some-model")  # any Hub id is accepted
    assert not step.catalog_table.selectedItems()
    assert step.validate() is None
    step.model_edit.setText("qwen-seven")
    problem = step.validate() or ""
    assert "not in the catalog, not a Hub id (org/name) and not a folder" in problem
    step.model_edit.setText("/no/such/model")
    assert "There is no folder /no/such/model" in (step.validate() or "")
    step.model_edit.setText(str(model_folder))
    assert step.validate() is None
    step.model_edit.setText(str(tmp_path))
    assert "has no config.json" in (step.validate() or "")


def test_method_and_advanced_settings_round_trip_through_the_draft(step: ModelStep, context: AppContext) -> None:
    assert step.method_buttons["qlora"].isChecked()
    assert not step.advanced_box.isVisible()
    step.advanced_toggle.click()
    assert step.advanced_box.isVisible()
    step.method_buttons["full-8bit"].click()
    assert not step.spins["lora_r"].isEnabled() and not step.spins["lora_alpha"].isEnabled()
    step.method_buttons["lora"].click()
    assert step.spins["lora_r"].isEnabled()
    wanted = {
        "lora_r": 64,
        "lora_alpha": 128,
        "seq_len": 4096,
        "micro_batch": 4,
        "grad_accum": 8,
        "epochs": 1.5,
        "learning_rate": 5e-5,
        "checkpoint_minutes": 15,
        "keep_checkpoints": 5,
        "eval_steps": 25,
        "max_steps": 60,
    }
    for key, value in wanted.items():
        step.spins[key].setValue(value)
    step.model_edit.setText("Qwen/Qwen2.5-7B-Instruct")
    draft = context.draft
    draft.training["seed"] = 7  # keys the step does not show are kept
    step.save_into(draft)
    assert (draft.base_model, draft.method) == ("Qwen/Qwen2.5-7B-Instruct", "lora")
    assert draft.training == {**wanted, "seed": 7}
    assert isinstance(draft.training["seq_len"], int)
    # A fresh step shows the saved draft again.
    again = ModelStep(context)
    again.show_draft()
    assert again.method_buttons["lora"].isChecked()
    assert again.model_edit.text() == "Qwen/Qwen2.5-7B-Instruct"
    assert again.training_values() == wanted
    again.deleteLater()


def test_sequence_length_beyond_the_models_context_is_refused(step: ModelStep) -> None:
    step.model_edit.setText("microsoft/phi-2")
    step.spins["seq_len"].setValue(4096)
    problem = step.step_problem()
    assert problem is not None and problem.field is step.spins["seq_len"]
    assert problem.headline == "The sequence length 4,096 is longer than microsoft/phi-2 handles: 2,048 tokens"
    step.show_problem(problem)  # what the wizard does on Next: the advanced settings unfold, the box is marked
    assert step.advanced_box.isVisible() and step.spins["seq_len"].property("invalid") == "true"
    step.spins["seq_len"].setValue(2048)
    assert step.validate() is None


def test_learning_rate_box_reads_scientific_notation(step: ModelStep, qtbot: QtBot) -> None:
    box = step.spins["learning_rate"]
    assert box.text() == f"{DEFAULT_TRAINING['learning_rate']:g}"
    step.advanced_toggle.click()
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, "3e-5")
    qtbot.keyClick(box, Qt.Key.Key_Enter)
    assert box.value() == pytest.approx(3e-5)


def test_every_field_has_a_name_and_is_reachable_with_tab(step: ModelStep, qtbot: QtBot) -> None:
    step.advanced_toggle.setChecked(True)
    step.activateWindow()
    step.filter_edit.setFocus()
    qtbot.waitUntil(step.filter_edit.hasFocus)
    reached: list[QWidget] = []
    for _ in range(40):
        focused = QApplication.focusWidget()
        assert focused is not None
        reached.append(focused)
        qtbot.keyClick(focused, Qt.Key.Key_Tab)
    fields: list[QWidget] = [step.filter_edit, step.catalog_table, step.model_edit, step.browse_button]
    fields += [step.method_group.checkedButton(), step.advanced_toggle, *step.spins.values()]
    for field in fields:
        assert field in reached, field.accessibleName()
        assert field.accessibleName()
    assert all(button.accessibleName() for button in step.method_buttons.values())
    assert [value for value, _, _ in METHODS] == list(step.method_buttons)
    assert [f.key for f in TRAINING_FIELDS] == list(step.spins)


def test_the_training_boxes_take_their_ranges_from_the_payload() -> None:
    """A value the wizard's boxes allow is one the trainer on the machine accepts: one table of ranges."""
    for field in TRAINING_FIELDS:
        if field.key in JOB_INT_RANGES:
            assert (field.low, field.high) == JOB_INT_RANGES[field.key], field.key
    assert {"lora_r", "seq_len", "micro_batch", "grad_accum", "keep_checkpoints"} <= {f.key for f in TRAINING_FIELDS}


def test_the_wheel_over_an_unfocused_lora_rank_leaves_it_alone(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, context: AppContext
) -> None:
    app = QApplication.instance()
    assert app is not None
    guard = install_wheel_guard(app)  # as the app does at start, before any window exists
    try:
        step = ModelStep(context)
        qtbot.addWidget(step)
        step.resize(1024, 600)
        step.show()
        step.activateWindow()
        qtbot.waitExposed(step)
        step.advanced_toggle.setChecked(True)
        qtbot.waitUntil(step.advanced_box.isVisible)
        QApplication.processEvents()
        rank = step.spins["lora_r"]
        assert rank.focusPolicy() == Qt.FocusPolicy.StrongFocus, "a wheel never focuses a number field"
        step.filter_edit.setFocus()
        qtbot.waitUntil(step.filter_edit.hasFocus)
        before = rank.value()
        page = step.scroll_area.verticalScrollBar()
        assert page.maximum() > 0, "the step overflows its window here"
        wheel(rank, -3)
        assert page.value() > 0, "the wheel over the box scrolls the page instead"
        wheel(rank, 2)
        assert rank.value() == before, "scrolling the page over the box does not edit it"
        rank.setFocus()
        qtbot.waitUntil(rank.hasFocus)
        wheel(rank, 1)
        assert rank.value() == before + rank.singleStep(), "once focused, the wheel does step it"
    finally:
        app.removeEventFilter(guard)


@pytest.mark.parametrize("size", [(1024, 700), (1280, 800), (1920, 1080)])
def test_the_model_step_fits_the_window_with_advanced_settings_open(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, context: AppContext, size: tuple[int, int]
) -> None:
    window = MainWindow(context.settings, context.secrets, context)
    qtbot.addWidget(window)
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    qloop.run_until_complete(window.wizard.load())
    window.show_page("model")
    step = window.wizard.current
    assert isinstance(step, ModelStep)
    step.advanced_toggle.setChecked(True)
    qtbot.waitUntil(step.advanced_box.isVisible)
    QApplication.processEvents()
    scroll = step.scroll_area
    assert scroll.horizontalScrollBar().maximum() == 0, "nothing scrolls sideways"
    assert scroll.widget().width() <= scroll.viewport().width()
    assert step.width() <= METRICS.content_width, "the content stays in its column"
    for spin in step.spins.values():  # no field vanishes or is squeezed below what it needs
        assert spin.width() >= spin.minimumSizeHint().width() and spin.height() >= spin.minimumSizeHint().height()
        assert spin.geometry().right() <= step.advanced_box.width()
        assert spin.lineEdit().width() >= spin.fontMetrics().horizontalAdvance(spin.text()), "its number shows"
    for button in step.method_buttons.values():
        assert button.width() >= button.sizeHint().width(), button.text()
    table = step.catalog_table
    widest = max((table.fontMetrics().horizontalAdvance(e.id) for e in load_catalog()), default=0)
    assert table.columnWidth(0) >= widest, "model ids are shown whole"
    assert table.horizontalScrollBar().maximum() == 0


def test_a_number_out_of_range_becomes_the_nearest_allowed_and_its_field_says_why(
    qtbot: QtBot, step: ModelStep
) -> None:
    step.advanced_toggle.setChecked(True)
    epochs = step.spins["epochs"]
    epochs.setValue(3)
    type_and_leave(qtbot, epochs, "0.05")
    assert epochs.value() == pytest.approx(0.1), "the nearest number it takes, not the old 3.00 back"
    assert step.notes["epochs"].isVisible()
    assert step.notes["epochs"].text() == (
        "Epochs (passes over the data): “0.05” is below the lowest it takes, so it is 0.10 now. "
        "Type a number from 0.10 to 1000.00."
    )
    rank = step.spins["lora_r"]
    type_and_leave(qtbot, rank, "0")
    assert rank.value() == 1 and step.notes["lora_r"].isVisible()
    assert step.notes["epochs"].isVisible(), "an earlier correction is not replaced by the latest"
    type_and_leave(qtbot, rank, "16")
    assert rank.value() == 16 and not step.notes["lora_r"].isVisible(), "a number in range clears its note"
    assert step.notes["epochs"].isVisible()


@pytest.mark.parametrize(
    ("key", "typed", "kept"),
    [("epochs", "2000", 1000.0), ("seq_len", "99999999", 1_048_576), ("keep_checkpoints", "999999", 1000)],
)
def test_a_number_above_the_highest_is_said_beside_its_field_not_cut_silently(
    qtbot: QtBot, step: ModelStep, key: str, typed: str, kept: float
) -> None:
    # Qt refused the keystroke past the highest: 2000 epochs became 200, and 99999999 tokens 999,999, without a word.
    step.advanced_toggle.setChecked(True)
    box = step.spins[key]
    type_and_leave(qtbot, box, typed)
    assert box.value() == pytest.approx(kept)
    note = step.notes[key]
    assert note.isVisible() and f"“{typed}” is above the highest it takes, so it is {box.text()} now." in note.text()
    assert note.text().startswith(next(field.label for field in TRAINING_FIELDS if field.key == key))
    # beside its own field: right under it, in its column (once the layout has made room for the line, as seen)
    qtbot.waitUntil(lambda: box.height() > 0 and note.height() > 0)
    spot, under = box.geometry(), note.geometry()
    assert under.top() >= spot.bottom() and under.top() - spot.bottom() < spot.height()
    assert under.left() <= spot.left() < under.right()
    assert [other for other, line in step.notes.items() if line.isVisible()] == [key]


def test_trackers_are_asked_for_under_advanced_settings_and_reach_the_spec_the_review_and_its_key_check(
    step: ModelStep, qtbot: QtBot, context: AppContext
) -> None:
    from desktop.services.platform.secrets import SecretName, SecretStore
    from desktop.services.runs.preflight import ReviewFacts, preflight
    from desktop.ui.pages.wizard.review_words import model_rows

    step.advanced_toggle.setChecked(True)
    assert not any(check.isChecked() for check in step.tracker_checks.values())
    for tracker in ("tensorboard", "trackio", "wandb"):
        step.tracker_checks[tracker].setFocus()
        qtbot.keyClick(step.tracker_checks[tracker], Qt.Key.Key_Space)
    draft = context.draft
    step.model_edit.setText("Qwen/Qwen2.5-0.5B-Instruct")
    step.save_into(draft)
    assert draft.spec_dict()["training"]["report_to"] == ["tensorboard", "trackio", "wandb"]
    assert dict(model_rows(draft))["Metrics to"] == (
        "TensorBoard (event files home with every checkpoint); trackio (its database home with every checkpoint); "
        "Weights & Biases (sent from the machine with your key)"
    )
    headlines = [check.headline for check in preflight(draft, ReviewFacts()) if check.required]
    assert "Weights & Biases needs your API key" in headlines, "no key: the run is not started"
    SecretStore().set(SecretName.WANDB, "local-" + "2" * 48)
    facts = ReviewFacts(wandb_key=True)
    assert "Weights & Biases needs your API key" not in [check.headline for check in preflight(draft, facts)]
    step.show_draft()
    assert all(check.isChecked() for check in step.tracker_checks.values()), "a reopened wizard shows the choice"
    for check in step.tracker_checks.values():
        check.setChecked(False)
    step.save_into(draft)
    assert "report_to" not in draft.spec_dict()["training"]
