"""The Chat page with real llama.cpp: streamed answers from a real GGUF, Stop, Clear, Copy, side by side, keyboard.

SmolLM2-135M-Instruct (Q4_1) answers the single-model tests; side by side, the tiny pattern model's base GGUF and
the same base with its GGUF LoRA answer a question only the fine-tune knows.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QFileDialog, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.data.check import check_dataset
from desktop.services.local.chat import Conversation
from desktop.services.local.chat_history import load_history
from desktop.services.local.common import no_progress
from desktop.services.local.gguf import convert_lora_to_gguf, convert_to_gguf
from desktop.services.local.inventory import exports_folder
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.chat_page import ChatPage
from tests.fixtures.adapters import TrainedAdapter
from tests.fixtures.gguf_models import build_once_per_run
from tests.fixtures.smollm2 import SmolLM2
from tests.local.test_chat import direct_answer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class BaseAndLora:
    """The tiny pattern model as a GGUF, and its adapter as a GGUF LoRA."""

    base: Path
    lora: Path
    pattern: list[tuple[str, str]]


async def _convert(adapter: TrainedAdapter, folder: Path) -> BaseAndLora:
    base = await convert_to_gguf(adapter.base, folder / "base-F16.gguf", progress=no_progress)
    lora = await convert_lora_to_gguf(adapter.path, adapter.base, folder / "adapter-lora.gguf", progress=no_progress)
    return BaseAndLora(base, lora, adapter.pattern)


@pytest.fixture(scope="module")
def base_and_lora(gguf_pattern_adapter: TrainedAdapter, tmp_path_factory: pytest.TempPathFactory) -> BaseAndLora:
    return build_once_per_run(
        tmp_path_factory, "chat-base-lora", lambda folder: asyncio.run(_convert(gguf_pattern_adapter, folder))
    )


@pytest.fixture
def page(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> Iterator[ChatPage]:
    context = AppContext(Settings(), SecretStore())
    widget = ChatPage(context)  # not qtbot.addWidget: pytest-qt would delete it before the models are freed
    widget.resize(1100, 760)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    qloop.run_until_complete(widget.close_models())
    qloop.run_until_complete(context.manager.close())
    widget.close()
    widget.deleteLater()


def ready(page: ChatPage, index: int = 0) -> Callable[[], bool]:
    return lambda: page.columns[index].badge.text() == "Ready"


def idle(page: ChatPage) -> Callable[[], bool]:
    return lambda: not page.answering


def ask(page: ChatPage, qtbot: QtBot, text: str) -> None:
    page.prompt.setFocus()
    qtbot.keyClicks(page.prompt, text)
    qtbot.keyClick(page.prompt, Qt.Key.Key_Return)


def test_an_answer_streams_token_by_token_and_matches_llama_cpp(
    page: ChatPage, qtbot: QtBot, wait_for: Callable[..., None], smollm2: SmolLM2
) -> None:
    page.open_model(str(smollm2.gguf))
    wait_for(lambda: page.columns[0].badge.text() in ("Loading…", "Ready"), timeout=30)  # loads in the background
    wait_for(ready(page), timeout=120)
    assert not page.columns[0].busy_bar.isVisible()
    page.temperature_spin.setValue(0)
    page.tokens_spin.setValue(24)
    updates: list[str] = []
    page.columns[0].transcript.textChanged.connect(lambda: updates.append(page.columns[0].text()))

    ask(page, qtbot, "What is the capital of France?")
    assert page.prompt.text() == "" and not page.send_button.isEnabled() and page.stop_button.isEnabled()
    wait_for(idle(page), timeout=120)

    expected = direct_answer(smollm2.gguf, [{"role": "user", "content": "What is the capital of France?"}], 24)
    column = page.columns[0]
    assert column.last_answer() == expected and expected.strip()
    shown, footer = column.text().rsplit("\n", 1)
    assert shown.endswith(expected.strip())  # shown as Markdown once complete (plain text here)
    assert re.fullmatch(r"\d+ tokens · [\d.]+ tokens/s · first after [\d.]+ s · Copy", footer), footer
    assert "What is the capital of France?" in column.text()
    before = shown[: len(shown) - len(expected.strip())]
    growing = [text for text in updates if text.startswith(before) and len(before) < len(text) < len(shown)]
    assert len(growing) > 5  # the answer appeared piece by piece, not at once
    assert page.send_button.isEnabled() and not page.stop_button.isEnabled()
    page.columns[0].copy_button.click()
    assert QGuiApplication.clipboard().text() == expected


def test_stop_ends_the_answer_and_clear_forgets_the_conversation(
    page: ChatPage, qtbot: QtBot, wait_for: Callable[..., None], smollm2: SmolLM2
) -> None:
    page.open_model(str(smollm2.gguf))
    wait_for(ready(page), timeout=120)
    page.temperature_spin.setValue(0)
    page.tokens_spin.setValue(2000)
    column = page.columns[0]

    ask(page, qtbot, "Count from 1 to 500, one number per line.")
    wait_for(lambda: len(column.text()) > 80, timeout=120)
    page.stop_button.click()
    wait_for(idle(page), timeout=30)

    stopped = column.last_answer()
    assert stopped and len(stopped) < 1500  # far from the 500 numbers asked for
    assert column.text().splitlines()[-1].startswith("(stopped) ")  # then its speed and Copy
    assert column.badge.text() == "Ready" and page.send_button.isEnabled()
    assert [turn["role"] for turn in column.conversation.turns] == ["user", "assistant"]

    page.clear_button.click()
    assert column.text() == "" and column.conversation.turns == [] and column.last_answer() == ""
    assert not column.copy_button.isEnabled()


def test_side_by_side_the_base_and_the_fine_tune_answer_the_same_message(
    page: ChatPage, qtbot: QtBot, wait_for: Callable[..., None], base_and_lora: BaseAndLora
) -> None:
    question, taught = base_and_lora.pattern[0]
    page.open_model(str(base_and_lora.base), str(base_and_lora.lora))
    page.side_check.setChecked(True)  # the second column starts as the base without the LoRA
    assert page.key(1) == (base_and_lora.base, None)
    assert page.columns[1].isVisible()
    assert [c.title_label.text() for c in page.columns if c.title_label] == ["Fine-tuned", "Base"]
    wait_for(lambda: ready(page, 0)() and ready(page, 1)(), timeout=120)
    page.temperature_spin.setValue(0)
    page.tokens_spin.setValue(24)

    ask(page, qtbot, question)
    wait_for(idle(page), timeout=120)

    tuned, base = (column.last_answer().strip() for column in page.columns)
    assert tuned == taught
    assert base != taught  # the base alone does not know the made-up answer (a random model may say nothing)
    assert all(question in column.text() for column in page.columns)
    assert "\nFine-tuned\n" in page.columns[0].text() and "\nBase\n" in page.columns[1].text()


def test_keyboard_alone_reaches_the_prompt_and_enter_sends(
    page: ChatPage, qtbot: QtBot, wait_for: Callable[..., None], smollm2: SmolLM2
) -> None:
    page.open_model(str(smollm2.gguf))
    page.tokens_spin.setValue(8)
    page.activateWindow()
    page.pickers[0].combo.setFocus()
    for _ in range(30):
        if QApplication.focusWidget() is page.prompt:
            break
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is page.prompt
    qtbot.keyClicks(page.prompt, "Hello")
    qtbot.keyClick(page.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert page.prompt.text() == "Hello\n" and not page.answering  # Shift+Enter is a new line
    qtbot.keyClicks(page.prompt, "there")
    qtbot.keyClick(page.prompt, Qt.Key.Key_Return)
    wait_for(lambda: bool(page.columns[0].last_answer()) and idle(page)(), timeout=180)
    assert "Hello\nthere" in page.columns[0].text()
    controls = [
        widget
        for widget in page.findChildren(QWidget)
        if widget.focusPolicy() != Qt.FocusPolicy.NoFocus
        and widget.isVisibleTo(page)
        and not isinstance(widget.parentWidget(), QAbstractSpinBox)  # a spin box's own text field
    ]
    assert controls and all(widget.accessibleName() for widget in controls), [
        type(widget).__name__ for widget in controls if not widget.accessibleName()
    ]


def test_a_file_that_is_not_a_model_is_a_readable_sentence(
    page: ChatPage, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("hello")
    page.open_model(str(bogus))
    wait_for(page.banner.isVisible, timeout=30)
    assert page.banner.headline_label.text() == "Model: the model did not load."
    details = page.banner.details_label.text()
    assert f"{bogus} is not a GGUF file" in details
    assert "--" not in details and "rentune" not in details
    assert page.columns[0].badge.text() == "Could not load"


def test_each_answer_has_its_speed_and_copy_regenerates_saves_as_training_data_and_comes_back(
    page: ChatPage,
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    smollm2: SmolLM2,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page.open_model(str(smollm2.gguf))
    wait_for(ready(page), timeout=120)
    page.temperature_spin.setValue(0)
    page.tokens_spin.setValue(8)
    column = page.columns[0]
    assert not page.again_button.isEnabled() and not page.save_button.isEnabled()  # nothing answered yet
    for question in ("Say hello.", "Say goodbye."):
        ask(page, qtbot, question)
        wait_for(idle(page), timeout=120)
    first, second = column.answers
    assert 'href="copy:1"' in column.transcript.toHtml() and 'href="copy:2"' in column.transcript.toHtml()
    column.transcript.anchorClicked.emit(QUrl("copy:1"))  # the Copy link under the first answer
    assert QGuiApplication.clipboard().text() == first

    page.again_button.click()  # greedy: the same answer again, replacing the last one in the history
    wait_for(idle(page), timeout=120)
    assert column.answers == [first, second] and len(column.conversation.turns) == 4
    assert "· answered again" in column.text()

    target = tmp_path / "good-chats.jsonl"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *_args: (str(target), ""))
    page.save_button.click()
    wait_for(lambda: "Added this chat" in page.banner.headline_label.text(), timeout=30)
    messages = json.loads(target.read_text(encoding="utf-8"))["messages"]
    assert [m["content"] for m in messages] == ["Say hello.", first, "Say goodbye.", second]
    assert check_dataset(target).report.valid == 1

    again = ChatPage(page.context)  # the app opened again: the chat with this model comes back
    again.show()
    again.open_model(str(smollm2.gguf))
    wait_for(lambda: len(again.columns[0].answers) == 2, timeout=120)
    assert again.columns[0].conversation.turns == column.conversation.turns
    assert "from your last session" in again.columns[0].text()
    qloop.run_until_complete(again.close_models())
    again.close()
    again.deleteLater()


def test_an_answer_in_markdown_shows_its_code_block_in_a_fixed_width_font(page: ChatPage) -> None:
    answer = "Run this:\n\n```python\nprint('hi')\n```\n\nThen **check** it."
    conversation = Conversation(None, [{"role": "user", "content": "How?"}, {"role": "assistant", "content": answer}])
    column = page.columns[0]
    column.show_saved(conversation)
    text = column.text()
    assert "print('hi')" in text and "```" not in text and "**" not in text
    block = column.transcript.document().find("print('hi')")
    assert block.charFormat().font().fixedPitch() or "monospace" in block.charFormat().fontFamilies()[0].lower()
    assert column.answers == [answer]


def test_with_no_model_the_column_says_what_to_do_in_lines_that_wrap(page: ChatPage) -> None:
    from desktop.services.runs.adapters import Inventory
    from desktop.ui.pages.chat_page import NO_MODEL_YET

    page.show_inventory(Inventory())
    hint = page.columns[0].hint_label
    page.resize(700, 700)
    QApplication.processEvents()
    assert hint.isVisible() and hint.text() == NO_MODEL_YET and hint.wordWrap()
    assert hint.height() > 1.5 * hint.fontMetrics().height(), "it wraps (a placeholder ran off the right edge)"
    assert hint.width() <= page.columns[0].width()


def _link(source: Path, target: Path) -> Path:
    """``target`` as another file of the same bytes (a hard link where the disk allows, else a copy)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        target.hardlink_to(source)
    except OSError:
        shutil.copyfile(source, target)
    return target


@pytest.fixture
def tuned_and_base(smollm2: SmolLM2) -> tuple[Path, Path]:
    """A run's exports as the chat lists them: the fine-tune's GGUF and the base's GGUF beside it (SmolLM2 both)."""
    folder = exports_folder("20261206-064119-9f71")
    return _link(smollm2.gguf, folder / "model-Q4_1.gguf"), _link(smollm2.gguf, folder / "base-Q4_1.gguf")


def choose(page: ChatPage, index: int, path: Path | None) -> None:
    """Picks ``path`` in the model list of column ``index`` as a user does (None: "Choose a model…")."""
    combo = page.pickers[index].combo
    row = 0 if path is None else combo.findData(str(path))
    assert row >= 0, f"{path} is not listed"
    combo.setCurrentIndex(row)
    combo.activated.emit(row)


def turns(*texts: str) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(texts)]


def test_each_model_keeps_its_own_conversation_when_the_choice_changes_and_after_a_restart(
    page: ChatPage,
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    tuned_and_base: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tuned, base = tuned_and_base
    qloop.run_until_complete(page.load())
    column = page.columns[0]
    page.temperature_spin.setValue(0)
    page.tokens_spin.setValue(12)
    choose(page, 0, tuned)
    wait_for(ready(page), timeout=120)
    ask(page, qtbot, "Say hello.")
    wait_for(idle(page), timeout=120)
    hello = column.last_answer()
    assert hello and column.conversation.turns == turns("Say hello.", hello)

    choose(page, 0, base)  # the base starts with its own (empty) conversation, not the fine-tune's
    assert column.conversation.turns == [] and "Say hello." not in column.text() and column.answers == []
    assert not page.save_button.isEnabled() and not page.again_button.isEnabled()
    wait_for(ready(page), timeout=120)
    ask(page, qtbot, "Name a colour.")
    wait_for(idle(page), timeout=120)
    colour = column.last_answer()
    assert column.conversation.turns == turns("Name a colour.", colour)
    assert colour == direct_answer(base, turns("Name a colour."), 12)  # asked alone, without the fine-tune's chat
    assert "Say hello." not in column.text()

    target = tmp_path / "good-chats.jsonl"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *_args: (str(target), ""))
    page.save_button.click()  # the chosen model's chat only
    wait_for(lambda: "Added this chat" in page.banner.headline_label.text(), timeout=30)
    assert json.loads(target.read_text(encoding="utf-8"))["messages"] == turns("Name a colour.", colour)

    choose(page, 0, tuned)  # the fine-tune's own conversation comes back
    assert column.conversation.turns == turns("Say hello.", hello) and column.answers == [hello]
    assert "Say hello." in column.text() and "Name a colour." not in column.text()
    assert page.save_button.isEnabled()
    page.side_check.setChecked(True)  # the base beside the fine-tune: the same conversation of the base
    assert page.key(1) == (base, None) and page.columns[1].conversation.turns == turns("Name a colour.", colour)
    page.side_check.setChecked(False)
    wait_for(lambda: not column._saving, timeout=30)
    assert (load_history(tuned) or Conversation()).turns == turns("Say hello.", hello)
    assert (load_history(base) or Conversation()).turns == turns("Name a colour.", colour)

    again = ChatPage(page.context)  # the app opened again: each model's chat comes back when it is chosen
    again.show()
    qloop.run_until_complete(again.load())
    choose(again, 0, base)
    wait_for(lambda: again.columns[0].answers == [colour], timeout=60)
    assert "Say hello." not in again.columns[0].text()
    choose(again, 0, tuned)
    wait_for(lambda: again.columns[0].answers == [hello], timeout=60)
    assert again.columns[0].conversation.turns == turns("Say hello.", hello)
    assert "Name a colour." not in again.columns[0].text()
    qloop.run_until_complete(again.close_models())
    again.close()
    again.deleteLater()


def test_banners_and_the_column_follow_the_current_choice(
    page: ChatPage,
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    tuned_and_base: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    tuned, _base = tuned_and_base
    qloop.run_until_complete(page.load())
    column = page.columns[0]
    ask(page, qtbot, "Hello")
    assert page.banner.isVisible() and page.banner.headline_label.text() == "Choose a model first."
    choose(page, 0, tuned)
    assert not page.banner.isVisible(), "the advice was followed: it goes"
    wait_for(ready(page), timeout=120)
    page.tokens_spin.setValue(6)
    qtbot.keyClick(page.prompt, Qt.Key.Key_Return)  # the message typed before is still there
    wait_for(idle(page), timeout=120)
    assert column.answers

    choose(page, 0, None)  # "Choose a model…": nothing is ready and nothing is shown
    assert column.badge.text() == "No model"
    assert column.text() == "" and column.hint_label.isVisible()
    assert column.model_label.text() == "Choose a model above."
    assert not page.save_button.isEnabled() and not page.again_button.isEnabled()

    bogus = tmp_path / "notes.gguf"
    bogus.write_text("hello")
    page.pickers[0].set_path(bogus)  # browsed for a file that is not a model
    page.pickers[0].sig_picked.emit()
    wait_for(page.banner.isVisible, timeout=30)
    assert page.banner.headline_label.text() == "Model: the model did not load."
    choose(page, 0, tuned)  # the error was about the other file
    assert not page.banner.isVisible()
    assert column.badge.text() in ("Loading…", "Not loaded")
    wait_for(ready(page), timeout=120)
    assert column.answers and "Hello" in column.text()

    page.side_check.setChecked(True)
    choose(page, 1, None)
    ask(page, qtbot, "Again")
    assert page.banner.headline_label.text() == "Choose the second model, or turn off Side by side."
    page.side_check.setChecked(False)
    assert not page.banner.isVisible()
