"""Review's "Try it here first": the draft's trial trained on this computer, its loss drawn, what it proved shown."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import ComputeDraft, RunDraft
from desktop.core.runs.states import RunState
from desktop.services.runs.store import RunStore
from desktop.ui.widgets.trial_card import IDLE_WORDS, TrialCard
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import TinyModel

pytestmark = pytest.mark.slow


def _draft(tmp_path: Path, base: str) -> RunDraft:
    tmp_path.mkdir(parents=True, exist_ok=True)
    train = write_chat_dataset(tmp_path / "train.jsonl", count=400)
    compute = ComputeDraft(provider="runpod", offer_id="x", gpu="RTX 4090", count=1, vram_gb=24, price_per_hour=0.69)
    training = {"lora_r": 8, "seq_len": 128, "learning_rate": 0.003}
    return RunDraft(
        data_file=str(train), train_file=str(train), base_model=base, method="qlora", training=training, compute=compute
    )


def _card(qtbot: QtBot, draft: RunDraft) -> TrialCard:
    card = TrialCard(lambda: draft, RunStore())
    qtbot.addWidget(card)
    card.resize(900, 700)
    card.show()
    return card


def test_a_click_trains_the_slice_draws_the_loss_and_shows_what_it_proved(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path, tiny_model: TinyModel
) -> None:
    card = _card(qtbot, _draft(tmp_path, str(tiny_model.path)))
    card.try_button.click()
    assert card.task is not None and not card.try_button.isEnabled()
    qloop.run_until_complete(card.task)
    result = card.result
    assert result is not None and result.loss_falls, card.status_label.text()
    assert card.status_label.text() == "Trial done: nothing was rented." and card.try_button.isEnabled()
    assert card.verdict_label.text().startswith("The loss fell from") and "template and labels train" in (
        card.verdict_label.text()
    )
    assert "tokens/s" in card.measured_label.text() and f"run {result.run_id}" in card.measured_label.text()
    assert card.answers_label.text().count("The trial's adapter:") == 3
    assert card.chart.point_counts() == (50, 0) and not card.stop_button.isVisible()
    assert RunStore().get(result.run_id).state is RunState.FINISHED


def test_a_model_too_big_for_this_computer_is_not_tried_and_stop_keeps_nothing(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path, tiny_model: TinyModel
) -> None:
    card = _card(qtbot, _draft(tmp_path, "qwen2.5-72b"))
    card.try_button.click()
    assert card.task is not None
    qloop.run_until_complete(card.task)
    assert card.status_label.text().startswith("Too big to try here:") and card.result is None
    card.draft_of = lambda: _draft(tmp_path / "small", str(tiny_model.path))
    card.try_button.click()
    task = card.task
    assert task is not None

    async def stop_at_the_first_step() -> None:
        while not card.chart.point_counts()[0]:
            assert not task.done(), card.status_label.text()
            await asyncio.sleep(0.05)
        card.stop_button.click()
        with pytest.raises(asyncio.CancelledError):
            await task

    qloop.run_until_complete(asyncio.wait_for(stop_at_the_first_step(), 120))
    assert card.status_label.text() == "Trial stopped: nothing was kept." and RunStore().all() == []


def test_a_preference_run_is_not_offered_a_trial_and_says_why_and_chats_get_it_back(
    qtbot: QtBot, tmp_path: Path
) -> None:
    card = _card(qtbot, _draft(tmp_path, "org/tiny"))
    assert card.try_button.isEnabled()
    card.offer_for("dpo")
    assert not card.try_button.isEnabled()
    assert "A DPO run on preference pairs" in card.status_label.text()
    card.offer_for("sft")
    assert card.try_button.isEnabled() and card.status_label.text() == IDLE_WORDS
