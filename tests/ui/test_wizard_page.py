"""The wizard's frame on its real Data, Model and Sizing steps: keyboard-only use, the step indicator, fixed
buttons, banners at the top of a step with the field marked, and numbers that agree from one step to the next."""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QApplication, QLabel, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.data.numbers import read_data_numbers
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.data_step import DataStep
from desktop.ui.pages.wizard.data_words import model_words
from desktop.ui.pages.wizard.model_step import ModelStep
from desktop.ui.pages.wizard.sizing_step import SizingStep
from desktop.ui.pages.wizard.wizard_page import WizardPage
from tests.fixtures.tiny_models import TinyModel


@pytest.fixture
def wizard(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> WizardPage:
    gc.collect()
    context = AppContext(Settings(), SecretStore())
    page = WizardPage(context, [DataStep(context), ModelStep(context), SizingStep(context)])
    qtbot.addWidget(page)
    page.resize(1100, 800)
    page.show()
    page.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is page)
    qloop.run_until_complete(page.load())
    return page


def data_of(wizard: WizardPage) -> DataStep:
    step = wizard.step("data")
    assert isinstance(step, DataStep)
    return step


def model_of(wizard: WizardPage) -> ModelStep:
    step = wizard.step("model")
    assert isinstance(step, ModelStep)
    return step


def sizing_of(wizard: WizardPage) -> SizingStep:
    step = wizard.step("sizing")
    assert isinstance(step, SizingStep)
    return step


def type_and_enter(qtbot: QtBot, field: QWidget, text: str) -> None:
    """Focuses a field, types ``text`` and presses Enter, as a keyboard user would."""
    field.setFocus()
    qtbot.waitUntil(field.hasFocus)
    field.selectAll()  # type: ignore[attr-defined]
    qtbot.keyClicks(field, text)
    qtbot.keyClick(field, Qt.Key.Key_Return)


def test_the_wizard_is_done_with_the_keyboard_alone_and_the_numbers_agree_on_every_step(
    wizard: WizardPage, qtbot: QtBot, wait_for: Callable[..., None], chat_dataset: Path, tiny_model: TinyModel
) -> None:
    data, model, sizing = data_of(wizard), model_of(wizard), sizing_of(wizard)
    # Data: Enter in the file field checks the file; a second Enter, once it is usable, moves on.
    type_and_enter(qtbot, data.path_edit, str(chat_dataset))
    assert wizard.current is data, "Enter while the check runs waits for it instead of warning"
    assert not data.problem_banner.isVisibleTo(data)
    wait_for(lambda: not data.running and data.check is not None, 60)
    before = data.check
    assert before is not None and before.numbers is not None and not before.numbers.exact  # no model yet
    qtbot.keyClick(data.path_edit, Qt.Key.Key_Return)
    assert wizard.current is model
    # Model: a folder typed in, Enter moves on to Sizing.
    type_and_enter(qtbot, model.model_edit, str(tiny_model.path))
    assert wizard.current is sizing
    wait_for(lambda: not sizing.running and sizing.facts is not None, 60)
    facts = sizing.facts
    assert facts is not None and facts.numbers is not None and facts.sizing is not None
    # The data was counted again with the model's own tokenizer: one number, from the prepared manifest.
    numbers = facts.numbers
    assert numbers.exact and numbers.model == str(tiny_model.path)
    assert numbers == read_data_numbers(wizard.context.draft.train_file)
    assert facts.sizing.plan.workload.tokens == numbers.train_tokens
    assert f"Tokens: {numbers.train_tokens:,} per epoch" in sizing.tokens_label.text()
    assert f"Counted with the tokenizer of {model_words(str(tiny_model.path))}" in sizing.tokens_label.text()
    # Back on Data (Back twice, by keyboard), the same numbers and tokenizer are shown: rechecked for the new model.
    for _ in range(2):
        wizard.back_button.setFocus()
        qtbot.keyClick(wizard.back_button, Qt.Key.Key_Space)
    assert wizard.current is data
    wait_for(lambda: not data.running and data.check is not None, 60)
    assert data.check is not None and data.check.numbers == numbers
    assert f"{numbers.train_tokens:,} tokens trained per epoch" in data.details_label.text()
    assert "Counted with the tokenizer of" in data.details_label.text()
    assert_words_for_people(wizard)


def assert_words_for_people(wizard: WizardPage) -> None:
    """No command-line flags, exception names or nested parentheses in any text the steps show."""
    for step in wizard.steps:
        for label in step.findChildren(QLabel):
            text = label.text()
            assert not re.search(r"--[a-z]", text), f"{step.step_name}: a CLI flag in {text!r}"
            assert not re.search(r"\b[A-Z]\w+(Error|Exception)\b", text), f"{step.step_name}: {text!r}"
            assert not re.search(r"\([^()]*\(", text), f"{step.step_name}: nested parentheses in {text!r}"


def test_a_new_sequence_length_is_counted_again_before_sizing(
    wizard: WizardPage, qtbot: QtBot, wait_for: Callable[..., None], chat_dataset: Path, tiny_model: TinyModel
) -> None:
    data, model, sizing = data_of(wizard), model_of(wizard), sizing_of(wizard)
    type_and_enter(qtbot, data.path_edit, str(chat_dataset))
    wait_for(lambda: not data.running and data.check is not None, 60)
    wizard.on_next()
    model.model_edit.setText(str(tiny_model.path))
    model.spins["seq_len"].setValue(32)  # shorter than most examples: truncation changes the tokens trained
    wizard.on_next()
    wait_for(lambda: not sizing.running and sizing.facts is not None, 60)
    first = sizing.facts.numbers if sizing.facts else None
    assert first is not None and first.seq_len == 32 and first.too_long > 0
    assert first.train_tokens <= 32 * first.train_examples
    wizard.on_back()
    model.spins["seq_len"].setValue(512)
    wizard.on_next()
    wait_for(lambda: not sizing.running and sizing.facts is not None and sizing.facts.numbers != first, 60)
    second = sizing.facts.numbers if sizing.facts else None
    assert second is not None and second.seq_len == 512 and second.train_tokens > first.train_tokens
    assert sizing.sizing is not None and sizing.sizing.plan.workload.tokens == second.train_tokens


def test_what_blocks_next_is_a_banner_at_the_top_with_the_field_marked_and_focused(
    wizard: WizardPage, qtbot: QtBot
) -> None:
    data = data_of(wizard)
    wizard.next_button.click()
    assert wizard.current is data
    banner = data.problem_banner
    assert banner.isVisibleTo(data) and banner.property("severity") == "danger"
    assert banner.headline_label.text() == "Choose your dataset first"
    assert "Choose file" in banner.details_label.text()
    assert data.path_edit.property("invalid") == "true" and data.path_edit.hasFocus()
    assert banner.geometry().top() < data.scroll_area.geometry().top(), "the banner sits above the step's content"
    assert wizard.problem_label.text() == "Choose your dataset first"
    data.path_edit.setText("/no/such/file.jsonl")  # the banner follows the state: the file is not checked yet
    data.sig_changed.emit()
    assert banner.headline_label.text() == "file.jsonl is not checked yet"


def test_a_sizing_problem_points_to_the_field_on_the_model_step(
    wizard: WizardPage, qtbot: QtBot, wait_for: Callable[..., None]
) -> None:
    model, sizing = model_of(wizard), sizing_of(wizard)
    wizard.context.draft.base_model = "some-org/some-model-not-cached"
    wizard.show_step("sizing")
    wait_for(lambda: not sizing.running and sizing.facts is not None, 60)
    assert sizing.problem_banner.isVisibleTo(sizing)
    assert sizing.problem_banner.headline_label.text() == "The Hugging Face Hub cannot be reached"
    assert sizing.problem_action.text() == "Change the model"
    wizard.on_next()
    assert wizard.current is sizing, "a job that cannot be sized blocks Next"
    sizing.problem_action.click()
    assert wizard.current is model and model.model_edit.hasFocus()


def test_the_step_indicator_goes_back_always_and_forward_only_to_steps_reached(
    wizard: WizardPage, qtbot: QtBot, wait_for: Callable[..., None], chat_dataset: Path
) -> None:
    data, model = data_of(wizard), model_of(wizard)
    buttons = wizard.indicator.buttons
    assert [b.isEnabled() for b in buttons] == [True, False, False], "steps not reached yet cannot be clicked"
    assert buttons[0].property("state") == "current" and "current step" in buttons[0].accessibleName()
    type_and_enter(qtbot, data.path_edit, str(chat_dataset))
    wait_for(lambda: not data.running and data.check is not None, 60)
    wizard.on_next()
    assert wizard.current is model and [b.isEnabled() for b in buttons] == [True, True, False]
    qtbot.mouseClick(buttons[0], Qt.MouseButton.LeftButton)
    assert wizard.current is data and buttons[1].isEnabled(), "a step reached stays reachable"
    buttons[1].setFocus()
    qtbot.keyClick(buttons[1], Qt.Key.Key_Space)
    assert wizard.current is model
    # Forward past a step that is not complete stops on it, with its problem shown.
    qtbot.mouseClick(buttons[0], Qt.MouseButton.LeftButton)
    data.path_edit.clear()
    qtbot.mouseClick(buttons[1], Qt.MouseButton.LeftButton)
    assert wizard.current is data and data.problem_banner.isVisibleTo(data)


def test_back_and_next_keep_their_places_and_next_is_the_primary_action(wizard: WizardPage) -> None:
    back, next_button = wizard.back_button, wizard.next_button
    assert next_button.property("role") == "primary" and next_button.isDefault()
    assert not back.isEnabled() and back.isVisible(), "Back keeps its place on the first step"
    assert back.geometry().right() < next_button.geometry().left()
    back_place = back.geometry()
    wizard.show_step("sizing")  # the last of these steps: Next is gone, Back stays where it was
    assert not next_button.isVisible() and back.isEnabled()
    assert back.geometry() == back_place


def test_enter_on_a_focused_button_presses_that_button(wizard: WizardPage, qtbot: QtBot) -> None:
    model = model_of(wizard)
    wizard.show_step("model")
    model.advanced_toggle.setFocus()
    qtbot.keyClick(model.advanced_toggle, Qt.Key.Key_Return)
    assert model.advanced_box.isVisible() and wizard.current is model


def test_every_control_of_the_steps_has_an_accessible_name(wizard: WizardPage) -> None:
    for name in ("data", "model", "sizing"):
        wizard.show_step(name)
        step = wizard.current
        if isinstance(step, ModelStep):
            step.advanced_toggle.setChecked(True)
        for widget in step.findChildren(QWidget):
            takes_focus = widget.focusPolicy() & Qt.FocusPolicy.TabFocus and widget.focusProxy() is None
            if takes_focus and widget.isVisibleTo(step):
                label = widget.accessibleName() or (widget.text() if isinstance(widget, QAbstractButton) else "")
                assert label, f"{name}: {type(widget).__name__} {widget.objectName()!r} has no accessible name"


def test_a_file_of_preference_pairs_trains_with_dpo_or_orpo_chosen_on_the_model_step(
    wizard: WizardPage, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path, tiny_model: TinyModel
) -> None:
    from desktop.core.runs.spec import run_spec_from_dict
    from desktop.ui.pages.wizard.model_step import objective_needs
    from desktop.ui.pages.wizard.review_words import judge_words, model_rows
    from tests.fixtures.preference_data import preference_pairs

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(row) + "\n" for row in preference_pairs(64)))
    data, model, sizing = data_of(wizard), model_of(wizard), sizing_of(wizard)
    type_and_enter(qtbot, data.path_edit, str(pairs))
    wait_for(lambda: not data.running and data.check is not None, 60)
    assert data.check is not None and data.check.usable, data.summary_label.text()
    assert "training pair" in data.details_label.text() and "DPO" in data.details_label.text()
    assert "chosen: " in data.preview_text.toPlainText() and "rejected: " in data.preview_text.toPlainText()
    qtbot.keyClick(data.path_edit, Qt.Key.Key_Return)
    assert wizard.current is model
    # Pairs train with a preference objective: DPO is proposed, fine-tuning on chats is greyed and says why.
    assert model.objective == "dpo" and model.beta_row.isVisibleTo(model)
    assert not model.objective_buttons["sft"].isEnabled()
    assert model.objective_notes["sft"].text() == objective_needs("sft", "pairs")
    assert model.objective_notes["sft"].text() == "Needs conversations: your data holds preference pairs."
    assert not model.objective_buttons["cpt"].isEnabled()
    model.objective_buttons["orpo"].setFocus()
    qtbot.keyClick(model.objective_buttons["orpo"], Qt.Key.Key_Space)
    model.beta_spin.setFocus()
    model.beta_spin.selectAll()
    qtbot.keyClicks(model.beta_spin, "0.2")
    type_and_enter(qtbot, model.model_edit, str(tiny_model.path))
    assert wizard.current is sizing
    wait_for(lambda: not sizing.running and sizing.facts is not None, 60)
    assert sizing.facts is not None and sizing.facts.sizing is not None
    assert sizing.facts.sizing.plan.setup.objective.value == "orpo"
    draft = wizard.context.draft
    spec = draft.spec_dict()
    assert spec["training"]["objective"] == "orpo" and spec["training"]["beta"] == pytest.approx(0.2)
    draft.judge_on_machine = True
    assert "judge" not in draft.spec_dict(), "a preference run is not judged on chats"
    assert "held-out pairs" in judge_words(draft, None)  # type: ignore[arg-type]
    assert dict(model_rows(draft))["Learns"].startswith("ORPO")
    spec_read = run_spec_from_dict({**draft.spec_dict(), "target": {"ssh": "ssh://me@127.0.0.1:22"}}, tmp_path)
    assert spec_read.training["objective"] == "orpo"
    assert_words_for_people(wizard)
    # Chats again: the objective follows the data back to supervised fine-tuning.
    draft.data_format = "messages"
    model.show_draft()
    assert model.objective == "sft" and not model.objective_buttons["dpo"].isEnabled()
    assert not model.beta_row.isVisibleTo(model)


def test_a_text_file_trains_with_continued_pretraining_and_its_paragraphs_count_as_packed(
    wizard: WizardPage, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path, tiny_model: TinyModel
) -> None:
    from desktop.ui.pages.wizard.review_words import judge_words, model_rows
    from tests.fixtures.domain_text import write_domain_text

    corpus = write_domain_text(tmp_path / "corpus.txt", 30)
    data, model, sizing = data_of(wizard), model_of(wizard), sizing_of(wizard)
    type_and_enter(qtbot, data.path_edit, str(corpus))
    wait_for(lambda: not data.running and data.check is not None, 60)
    assert data.check is not None and data.check.usable, data.summary_label.text()
    details = data.details_label.text()
    assert "Layout: raw text" in details and "paragraphs or documents (packed into full sequences" in details
    assert "continued pre-training" in details and "Packed into sequences of" in data.histogram_caption.text()
    assert data.preview_text.toPlainText().startswith("— Example 1 —\ntext: The ")
    qtbot.keyClick(data.path_edit, Qt.Key.Key_Return)
    assert wizard.current is model
    assert model.objective == "cpt" and not model.beta_row.isVisibleTo(model)
    assert [v for v, b in model.objective_buttons.items() if b.isEnabled()] == ["cpt"]
    assert model.objective_notes["dpo"].text() == "Needs preference pairs: your data holds raw text."
    type_and_enter(qtbot, model.model_edit, str(tiny_model.path))
    assert wizard.current is sizing
    wait_for(lambda: not sizing.running and sizing.facts is not None, 60)
    assert sizing.facts is not None and sizing.facts.sizing is not None
    assert sizing.facts.sizing.plan.setup.objective.value == "cpt"
    draft = wizard.context.draft
    assert draft.spec_dict()["training"]["objective"] == "cpt" and "beta" not in draft.spec_dict()["training"]
    draft.judge_on_machine = True
    assert "judge" not in draft.spec_dict() and "perplexity before and after" in judge_words(draft, None)  # type: ignore[arg-type]
    assert dict(model_rows(draft))["Learns"] == "Continued pre-training on raw text"
    assert_words_for_people(wizard)
