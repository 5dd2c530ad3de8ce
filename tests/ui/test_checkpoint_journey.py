"""A stopped run is not a dead end: its checkpoint exported to GGUF and chatted with beside the base, in the app only.

The run was stopped while it trained; the only thing it brought home is a sealed checkpoint (the tiny pattern
model's real LoRA adapter, as the payload writes one). From the run's monitor the user opens the checkpoint on the
Models page, exports it to GGUF Q8_0 with the base model beside it (real merge, llama.cpp's converter and quantiser
in their child processes), opens the chat from there, turns on side by side (the base GGUF is picked by default)
and asks the question only the fine-tune knows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.local.inventory import exports_folder
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.chat_page import ChatPage
from desktop.ui.pages.models_page import ModelsPage
from desktop.ui.pages.monitor_page import MonitorPage
from desktop.ui.widgets.local_dialogs import ExportDialog
from tests.fixtures.adapters import TrainedAdapter
from tests.fixtures.exported_models import record_stopped_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEP = 30


def test_a_stopped_runs_checkpoint_is_exported_and_chatted_with_beside_its_base(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], gguf_pattern_adapter: TrainedAdapter
) -> None:
    run_id = record_stopped_run(RunStore(), gguf_pattern_adapter.path, STEP, base=str(gguf_pattern_adapter.base))
    context = AppContext(Settings(), SecretStore())
    window = MainWindow(context.settings, context.secrets, context)
    qtbot.addWidget(window)
    window.show()
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window)
    qloop.run_until_complete(window.load_pages(follow_runs=False))
    chat = window.page("chat")
    assert isinstance(chat, ChatPage)
    try:
        open_the_checkpoint_from_the_monitor(window, wait_for, run_id)
        export_it_with_its_base(window, wait_for, run_id)
        ask_both(window, qtbot, wait_for, chat, gguf_pattern_adapter)
    finally:
        qloop.run_until_complete(chat.close_models())
        qloop.run_until_complete(context.manager.close())


def open_the_checkpoint_from_the_monitor(window: MainWindow, wait_for: Callable[..., None], run_id: str) -> None:
    """The stopped run's monitor offers Export or chat, which selects the checkpoint on the Models page."""
    window.show_page("runs")
    runs = window.page("runs")
    wait_for(lambda: runs.table.rowCount() == 1, 30)
    runs.table.selectRow(0)
    runs.open_button.click()
    monitor = window.page("monitor")
    assert isinstance(monitor, MonitorPage) and window.stack.currentWidget() is monitor
    wait_for(lambda: monitor.snapshot is not None and monitor.models_button.isVisible(), 30)
    assert not monitor.resume_button.isHidden()  # Resume is still offered beside it
    monitor.models_button.click()
    models = window.page("models")
    assert isinstance(models, ModelsPage) and window.stack.currentWidget() is models
    wait_for(lambda: models.selected() is not None and models.selected().adapter is not None, 30)
    row = models.tree.currentItem()
    assert row.text(0).startswith(f"Run {run_id} · step {STEP}")
    assert row.text(1) == f"Checkpoint, step {STEP} (run stopped)"
    assert models.export_button.isEnabled() and models.compare_button.isEnabled()
    assert not models.delete_button.isEnabled()  # a checkpoint stays with its run, for Resume
    assert "Resume continues from it" in models.detail_label.text()


def export_it_with_its_base(window: MainWindow, wait_for: Callable[..., None], run_id: str) -> None:
    """Export GGUF Q8_0 (instead of the preset Q4_K_M), with the base as GGUF beside it (ticked by default)."""
    models = window.page("models")
    assert isinstance(models, ModelsPage)
    models.export_button.click()
    dialog = models.dialog
    assert isinstance(dialog, ExportDialog)
    assert f"From the step-{STEP} checkpoint of run {run_id}." in [
        label.text() for label in dialog.findChildren(QLabel)
    ]
    assert dialog.gguf_check.isChecked() and dialog.base_gguf_check.isChecked()
    dialog.type_checks["Q4_K_M"].setChecked(False)
    dialog.type_checks["Q8_0"].setChecked(True)
    wait_for(dialog.start_button.isEnabled, 60)
    dialog.start_button.click()
    wait_for(lambda: models.task is None, 600)
    folder = exports_folder(f"{run_id}-step-{STEP}")
    assert sorted(p.name for p in folder.iterdir()) == ["base-Q8_0.gguf", "model-Q8_0.gguf"], (
        models.banner.details_label.text()
    )
    wait_for(models.chat_button.isEnabled, 30)  # the new file is listed and selected
    assert models.selected().item.path == folder / "model-Q8_0.gguf"
    models.chat_button.click()


def ask_both(
    window: MainWindow, qtbot: QtBot, wait_for: Callable[..., None], chat: ChatPage, adapter: TrainedAdapter
) -> None:
    """Side by side picks the base GGUF by default; only the fine-tuned checkpoint knows the taught answer."""
    assert window.stack.currentWidget() is chat
    chat.side_check.click()
    wait_for(lambda: chat.key(1) is not None, 30)  # once the exports are listed
    assert chat.key(1)[0].name == "base-Q8_0.gguf" and chat.key(0)[0].name == "model-Q8_0.gguf"
    assert [column.title_label.text() for column in chat.columns if column.title_label] == ["Fine-tuned", "Base"]
    wait_for(lambda: all(column.badge.text() == "Ready" for column in chat.columns), 120)
    chat.temperature_spin.setValue(0)
    chat.tokens_spin.setValue(24)
    question, taught = adapter.pattern[0]
    chat.prompt.setFocus()
    qtbot.keyClicks(chat.prompt, question)
    qtbot.keyClick(chat.prompt, Qt.Key.Key_Return)
    wait_for(lambda: not chat.answering, 120)
    tuned, base = (column.last_answer().strip() for column in chat.columns)
    assert tuned == taught
    assert base != taught
