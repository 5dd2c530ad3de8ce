"""The first-run screen: what a fine-tune needs, what is ready, and the way into the wizard."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import keyring.backends.fail
import keyring.backends.null
import pytest
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.services.data.workspace import check_and_prepare
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.drafts import load_draft, save_draft
from desktop.services.runs.store import RunStore
from desktop.ui.main_window import MainWindow
from desktop.ui.pages.home_page import HomePage
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.memory_keyring import using_keyring


def _open(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> MainWindow:
    window = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    qloop.run_until_complete(window.load_pages())
    return window


def _home(window: MainWindow) -> HomePage:
    page = window.page("home")
    assert isinstance(page, HomePage)
    return page


def test_a_first_run_says_what_is_needed_and_starts_the_wizard(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    window = _open(qtbot, qloop)
    home = _home(window)
    wait_for(lambda: home.dataset_tile.badge.text() != "Checking")
    assert home.dataset_tile.badge.text() == "Needed"
    assert home.gpu_tile.badge.text() == "Needed"
    assert "RunPod" in home.gpu_tile.text.text()
    assert home.keys_button.isVisibleTo(home)
    assert home.start_button.text().replace("&", "") == "Start a fine-tune"
    home.start_button.click()
    assert window.stack.currentWidget() is window.page("new")
    assert window.wizard.current.step_name == "data"


def test_a_stored_key_and_a_prepared_dataset_read_ready(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    SecretStore().set(SecretName.RUNPOD, "rk_test_" + "a1b2c3d4e5f6g7h8")
    source = write_chat_dataset(tmp_path / "support.jsonl", count=24)
    check = check_and_prepare(source, seq_len=512)
    save_draft(RunDraft(data_file=str(source), train_file=check.train_file, step="sizing"))
    window = _open(qtbot, qloop)
    home = _home(window)
    wait_for(lambda: home.dataset_tile.badge.text() == "Ready")
    assert "support.jsonl" in home.dataset_tile.text.text()
    wait_for(lambda: home.gpu_tile.badge.text() == "Ready")
    assert "RunPod API key" in home.gpu_tile.text.text()
    assert not home.keys_button.isVisibleTo(home)
    assert home.start_button.text().replace("&", "") == "Continue: Sizing"
    home.start_button.click()
    assert window.wizard.current.step_name == "sizing"


def test_a_draft_saved_at_an_unknown_step_opens_the_wizard_at_its_start(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    window = _open(qtbot, qloop)
    window.on_start_wizard("no-such-step")
    assert window.stack.currentWidget() is window.page("new")


def test_a_keyring_that_stores_nothing_is_not_called_ready(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", "rk_env_" + "a1b2c3d4e5f6g7h8")  # a key is there, but a run key would be lost
    with using_keyring(keyring.backends.null.Keyring()):
        window = _open(qtbot, qloop)
        home = _home(window)
        wait_for(lambda: home.gpu_tile.badge.text() != "Checking")
        wait_for(lambda: home.environment_summary.text() != "Checking…")
    assert home.gpu_tile.badge.text() == "Needed"
    assert home.gpu_tile.text.text().startswith(
        "Renting is blocked: the keyring backend keyring.backends.null.Keyring stores nothing: unset"
    )
    assert home.environment_summary.text() == "Needs attention: Keyring"
    assert home.tools_tile.badge.text() == "Needed"
    table = home.environment_table
    (row,) = [r for r in range(table.rowCount()) if table.item(r, 0).text().endswith("Keyring")]
    assert table.item(row, 1).text() == "the keyring backend keyring.backends.null.Keyring stores nothing"
    assert table.item(row, 2).text().startswith("unset PYTHON_KEYRING_BACKEND")


def test_without_any_keyring_keys_from_the_environment_are_ready(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", "vast_env_" + "a1b2c3d4e5f6g7h8")
    with using_keyring(keyring.backends.fail.Keyring()):
        window = _open(qtbot, qloop)
        home = _home(window)
        wait_for(lambda: home.gpu_tile.badge.text() == "Ready")
        wait_for(lambda: home.environment_summary.text() != "Checking…")
    assert "Vast.ai API key" in home.gpu_tile.text.text()
    assert home.environment_summary.text().startswith("Ready."), "a headless server rents with a run-key file"


def test_after_a_launch_home_offers_a_new_fine_tune_and_the_last_run(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    source = write_chat_dataset(tmp_path / "support.jsonl", count=24)
    prepared = check_and_prepare(source, seq_len=512)
    draft = RunDraft(
        data_file=str(source), train_file=prepared.train_file, eval_file=prepared.eval_file, base_model="org/model"
    )
    draft.step = "review"
    run = RunStore().create({"base_model": "org/model"}, "ssh://trainer@gpu-box:22")
    RunStore().transition(run.id, RunState.CANCELLED, "stopped by the user")  # ended: the app does not follow it
    draft.mark_launched(run.id)
    save_draft(draft)
    window = _open(qtbot, qloop)
    home = _home(window)
    wait_for(lambda: home.run_button.isVisibleTo(home))
    assert home.start_button.text().replace("&", "") == "Start a new fine-tune"  # not "Continue: Review and launch"
    assert home.run_button.text().replace("&", "") == "Open the last run (stopped)"
    home.run_button.click()
    assert window.stack.currentWidget() is window.page("monitor") and window.monitor.run_id == run.id

    window.show_page("home")
    home.start_button.click()  # starts over: the prepared data kept, the rest new, at the Data step
    assert window.stack.currentWidget() is window.page("new") and window.wizard.current.step_name == "data"
    wait_for(lambda: window.context.draft.train_file == prepared.train_file)  # the data step checks it again
    assert window.context.draft.base_model == ""
    assert not window.context.draft.launched
    assert load_draft().base_model == "" and load_draft().step == "data"  # saved as such
