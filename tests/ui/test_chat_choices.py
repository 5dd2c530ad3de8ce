"""The Chat page's choices without a model loaded: how the exports are named.

A run's final adapter and its checkpoints export files of the same names; the model list tells them apart.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.local.inventory import exports_folder
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.pages.chat_page import ChatPage
from tests.fixtures.exported_models import record_returned_run, write_gguf
from trainer_payload.checkpoints import seal_checkpoint


@pytest.fixture
def page(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> Iterator[ChatPage]:
    widget = ChatPage(AppContext(Settings(), SecretStore(), read_only=True))  # lists and shows; loads nothing
    qtbot.addWidget(widget)
    widget.resize(1100, 760)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget


def labels(combo: QComboBox) -> dict[str, str]:
    """Each listed path to its words."""
    return {combo.itemData(row): combo.itemText(row) for row in range(1, combo.count())}


def test_a_checkpoints_export_and_the_final_adapters_export_are_told_apart(
    page: ChatPage, qloop: asyncio.AbstractEventLoop
) -> None:
    store = RunStore()
    run = record_returned_run(store)
    checkpoint = store.folder(run) / "checkpoints" / "checkpoint-20"
    shutil.copytree(Path(store.get(run).adapter or ""), checkpoint)
    seal_checkpoint(checkpoint, 20)
    final = write_gguf(exports_folder(run) / "model-Q4_K_M.gguf", size=105_000_000)
    step = write_gguf(exports_folder(f"{run}-step-20") / "model-Q4_K_M.gguf", size=105_000_000)
    base = write_gguf(exports_folder(f"{run}-step-20") / "base-Q8_0.gguf", file_type=7, size=180_000_000)

    qloop.run_until_complete(page.load())

    listed = labels(page.pickers[0].combo)
    assert listed[str(final)] == f"model-Q4_K_M.gguf — final adapter of run {run}, 105 MB"
    assert listed[str(step)] == f"model-Q4_K_M.gguf — step-20 checkpoint of run {run}, 105 MB"
    assert listed[str(base)] == f"base-Q8_0.gguf — base model, exported with run {run} (step 20), 180 MB"
    combo = page.pickers[0].combo
    row = combo.findData(str(step))
    assert combo.itemData(row, Qt.ItemDataRole.ToolTipRole) == listed[str(step)]  # whole, where the box cuts it
    combo.setCurrentIndex(row)
    combo.activated.emit(row)
    assert page.columns[0].model_label.text() == f"model-Q4_K_M.gguf (105 MB) · step-20 checkpoint of run {run}"
