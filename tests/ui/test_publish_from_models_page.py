"""Publish on the Models page, for real, against the stand-in of the Hub's write API: asks, publishes, says where."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.local.inventory import exports_folder
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.pages.models_page import ModelsPage
from desktop.ui.widgets.publish_dialog import PublishDialog
from tests.fakes.hub_uploads import LFS_FROM_BYTES, HubUploads
from tests.fixtures.adapters import TrainedAdapter
from tests.fixtures.exported_models import record_returned_run, write_gguf

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def page(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, pattern_adapter: TrainedAdapter
) -> Iterator[tuple[ModelsPage, str]]:
    run_id = record_returned_run(RunStore(), pattern_adapter.path, base="HuggingFaceTB/SmolLM2-135M-Instruct")
    write_gguf(exports_folder(run_id) / "model-Q4_K_M.gguf", size=2 * LFS_FROM_BYTES)
    context = AppContext(Settings(), SecretStore())
    widget = ModelsPage(context)
    qtbot.addWidget(widget)
    widget.resize(1100, 760)
    widget.show()
    qtbot.waitExposed(widget)
    qloop.run_until_complete(widget.load())
    yield widget, run_id
    qloop.run_until_complete(context.close())


def _dialog(page: ModelsPage) -> PublishDialog:
    assert page.publish_button.isEnabled()
    page.publish_button.click()
    assert isinstance(page.dialog, PublishDialog) and page.dialog.isVisible()
    return page.dialog


def test_without_a_token_the_dialog_says_where_to_add_one(
    page: tuple[ModelsPage, str], hub_uploads: HubUploads
) -> None:
    dialog = _dialog(page[0])
    assert dialog.hint_label.text().startswith("Add a Hugging Face token with write access in Settings first")
    assert not dialog.publish_button.isEnabled()


def test_publish_creates_a_private_repo_with_the_adapter_the_gguf_chosen_and_the_card(
    page: tuple[ModelsPage, str], hub_uploads: HubUploads, wait_for: Callable[..., None]
) -> None:
    models, run_id = page
    SecretStore().set(SecretName.HUGGINGFACE, hub_uploads.token)
    dialog = _dialog(models)
    assert dialog.repo_edit.text() == f"SmolLM2-135M-Instruct-rentune-{run_id.rsplit('-', 1)[-1]}"
    assert dialog.private_check.isChecked(), "private by default"
    dialog.repo_edit.setText("bad--name")
    assert "is not a Hugging Face repo name" in dialog.hint_label.text() and not dialog.publish_button.isEnabled()
    dialog.repo_edit.setText("smol-pattern")
    (gguf_check,) = dialog.export_checks
    assert "model-Q4_K_M.gguf" in gguf_check.text() and not gguf_check.isChecked(), "large files only when asked"
    gguf_check.setChecked(True)
    assert dialog.hint_label.text().startswith("About ") and dialog.publish_button.isEnabled()
    dialog.publish_button.click()
    assert models.task is not None and models.task_card.isVisible()
    wait_for(lambda: models.task is None, timeout=120)

    assert models.banner.headline_label.text() == f"Published to {hub_uploads.url}/ada/smol-pattern", (
        models.banner.details_label.text()
    )
    repo = hub_uploads.repos["ada/smol-pattern"]
    assert repo.private and "gguf/model-Q4_K_M.gguf" in repo.files and "adapter_config.json" in repo.files
    assert repo.files["README.md"].startswith(b'---\nbase_model: "HuggingFaceTB/SmolLM2-135M-Instruct"')
    assert "gguf/model-Q4_K_M.gguf" in models.banner.details_label.text()
