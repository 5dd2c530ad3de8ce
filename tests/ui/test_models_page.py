"""The Models page on real runs and real files: the listing, a real GGUF export, Cancel, Delete that names the loss.

The export runs the real local services (merge, llama.cpp's converter, quantisation) on the tiny GGUF-convertible
model, in their child processes, driven from the page as a user would.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QLabel, QPushButton, QTreeWidgetItemIterator
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.local import tools
from desktop.services.local.inventory import ExportKind, exports_folder, scan_exports
from desktop.services.local.toolenv import PYTHON_ENV, ToolsState, ToolsStatus, tools_env
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.pages import models_page
from desktop.ui.pages.models_page import ModelsPage
from desktop.ui.widgets.confirm_delete import ConfirmDeleteDialog
from desktop.ui.widgets.local_dialogs import CompareDialog, ExportDialog
from desktop.ui.widgets.local_words import people_words
from tests.fakes.hub import FakeHub, HubRepo
from tests.fixtures.adapters import TrainedAdapter, write_pattern_jsonl
from tests.fixtures.exported_models import record_returned_run, seed_exports
from tests.fixtures.tiny_models import TinyModel
from tests.local.test_toolenv import fake_installed

# The session's tiny models and adapters are built by the first test that needs them (minutes on a busy machine).
pytestmark = pytest.mark.timeout(900)


class UrlCatcher(QObject):
    """Receives the URLs QDesktopServices is asked to open (instead of a browser or file manager)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[QUrl] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url)


@pytest.fixture
def opened() -> Iterator[UrlCatcher]:
    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("file", catcher, "open")
    yield catcher
    QDesktopServices.unsetUrlHandler("file")


@pytest.fixture
def context(qloop: asyncio.AbstractEventLoop) -> Iterator[AppContext]:
    ctx = AppContext(Settings(), SecretStore())
    yield ctx
    qloop.run_until_complete(ctx.manager.close())


@pytest.fixture
def page(qtbot: QtBot, context: AppContext, qloop: asyncio.AbstractEventLoop) -> Iterator[ModelsPage]:
    widget = ModelsPage(context)
    qtbot.addWidget(widget)
    widget.resize(1100, 760)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    if widget.task is not None:
        running = widget.task
        running.cancel()
        qloop.run_until_complete(running.wait())


def reload(page: ModelsPage, qloop: asyncio.AbstractEventLoop) -> None:
    qloop.run_until_complete(page.load())


def row_texts(page: ModelsPage) -> list[list[str]]:
    rows, iterator = [], QTreeWidgetItemIterator(page.tree)
    while (item := iterator.value()) is not None:
        rows.append([item.text(column) for column in range(page.tree.columnCount())])
        iterator += 1
    return rows


def export_dialog(page: ModelsPage) -> ExportDialog:
    page.export_button.click()
    assert isinstance(page.dialog, ExportDialog) and page.dialog.isVisible()
    return page.dialog


def child_processes() -> list[str]:
    """Command lines of this test process's children (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid():
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_an_empty_page_says_what_will_appear_and_how(
    page: ModelsPage, qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    RunStore().create({"base_model": "x"}, None)  # a run with no adapter yet lists nothing
    reload(page, qloop)
    assert page.views.currentIndex() == 0
    empty = page.views.widget(0)
    assert empty.accessibleName() == "No models here yet"
    texts = " ".join(label.text() for label in empty.findChildren(QLabel))
    assert "When a run finishes, its adapter comes home and appears here" in texts
    with qtbot.waitSignal(page.sig_new_run):
        empty.findChild(QPushButton).click()
    assert page.selected() is None and not page.export_button.isEnabled()


def test_a_returned_adapter_is_listed_with_size_time_cost_and_exports(
    page: ModelsPage, qloop: asyncio.AbstractEventLoop, pattern_adapter: TrainedAdapter
) -> None:
    store = RunStore()
    run_id = record_returned_run(store, pattern_adapter.path, base=str(pattern_adapter.base), rented_price=2.69)
    seed_exports(run_id, pattern_adapter.path)
    reload(page, qloop)

    rows = row_texts(page)
    # a base model folder is named by its folder (its whole path, cut at 1024 px, showed only its start); the
    # tooltip keeps the whole path
    assert rows[0][0] == f"Run {run_id} · {Path(pattern_adapter.base).name} (local folder)"
    assert f"Base model: {pattern_adapter.base}" in page.tree.topLevelItem(0).toolTip(0)
    assert rows[0][1] == "LoRA adapter" and rows[0][2].endswith(("KB", "MB"))
    assert rows[0][3] == "1 h 12 min · $3.46"
    assert ["model-Q4_K_M.gguf", "GGUF Q4_K_M", "4.68 GB", ""] in rows
    assert ["adapter-lora.gguf", "GGUF LoRA", "80.7 MB", ""] in rows
    assert "Trained on" in page.detail_label.text() and "$3.46" in page.detail_label.text()
    assert page.export_button.isEnabled() and page.compare_button.isEnabled() and page.delete_button.isEnabled()
    assert not page.chat_button.isEnabled()  # an adapter row: chat needs an export


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_export_to_gguf_from_the_page_writes_the_gguf(
    page: ModelsPage,
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    gguf_pattern_adapter: TrainedAdapter,
) -> None:
    store = RunStore()
    run_id = record_returned_run(store, gguf_pattern_adapter.path, base=str(gguf_pattern_adapter.base))
    reload(page, qloop)
    dialog = export_dialog(page)
    assert dialog.gguf_check.isChecked() and dialog.gguf_types() == ("Q4_K_M",)
    lines = dialog.needs_panel.lines
    assert lines[0] == f"Base model: {gguf_pattern_adapter.base} is on this computer.", lines
    # llama.cpp's converters are downloaded on the first GGUF step only: said until they are cached
    assert all("converters once" in line or line.startswith("Everything this needs") for line in lines[1:])
    assert dialog.start_button.isEnabled()
    dialog.type_checks["Q4_K_M"].setChecked(False)
    dialog.type_checks["Q8_0"].setChecked(True)
    dialog.base_gguf_check.setChecked(False)  # the base beside it: the checkpoint journey's test
    dialog.start_button.click()

    assert page.task is not None and page.task_card.isVisible()
    assert not page.export_button.isEnabled() and not page.delete_button.isEnabled()
    steps: set[str] = set()
    wait_for(lambda: steps.add(page.task_card.step_label.text()) or page.task is None, timeout=600)

    written = exports_folder(run_id) / "model-Q8_0.gguf"
    assert written.read_bytes()[:4] == b"GGUF", page.banner.details_label.text()
    assert "Exported" in page.banner.headline_label.text()
    assert any("merging" in step.lower() for step in steps) and any("gguf" in step.lower() for step in steps)
    assert sorted(p.name for p in exports_folder(run_id).iterdir()) == ["model-Q8_0.gguf"]  # no leftovers
    wait_for(lambda: len(row_texts(page)) == 2, timeout=30)  # the listing is read again in the background
    assert row_texts(page)[1][:2] == ["model-Q8_0.gguf", "GGUF Q8_0"]
    assert page.selected() is not None and page.selected().item is not None  # the new file is selected
    assert page.chat_button.isEnabled()
    with qtbot.waitSignal(page.sig_chat) as chat:
        page.chat_button.click()
    assert chat.args == [str(written), ""]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_cancel_kills_the_step_and_leaves_nothing_that_looks_finished(
    page: ModelsPage,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    gguf_pattern_adapter: TrainedAdapter,
) -> None:
    store = RunStore()
    run_id = record_returned_run(store, gguf_pattern_adapter.path, base=str(gguf_pattern_adapter.base))
    reload(page, qloop)
    dialog = export_dialog(page)
    dialog.merged_check.setChecked(True)
    dialog.start_button.click()
    wait_for(lambda: any("trainer_payload.merge" in line for line in child_processes()), timeout=120)

    page.task_card.cancel_button.click()
    wait_for(lambda: page.task is None, timeout=60)

    assert not any("trainer_payload.merge" in line for line in child_processes())
    folder = exports_folder(run_id)
    assert not folder.exists() or [p.name for p in folder.iterdir()] == []
    assert scan_exports(folder) == []
    assert page.banner.headline_label.text() == "Export cancelled."
    assert "Nothing half-written" in page.banner.details_label.text()
    assert page.export_button.isEnabled() and not page.task_card.isVisible()


def test_delete_asks_naming_what_is_lost_and_keep_keeps_it(
    page: ModelsPage, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], pattern_adapter: TrainedAdapter
) -> None:
    store = RunStore()
    run_id = record_returned_run(store, pattern_adapter.path, base=str(pattern_adapter.base), rented_price=2.69)
    folder = Path(store.get(run_id).adapter or "")
    reload(page, qloop)

    page.delete_button.click()
    dialog = page.dialog
    assert isinstance(dialog, ConfirmDeleteDialog) and dialog.isVisible()
    words = dialog.text()
    assert f"Delete the adapter of run {run_id}?" in words
    assert f"The adapter of run {run_id}, trained for 1 h 12 min, $3.46 — it cannot be downloaded again" in words
    assert dialog.keep_button.isDefault()
    dialog.keep_button.click()
    assert folder.is_dir()

    page.delete_button.click()
    assert isinstance(page.dialog, ConfirmDeleteDialog)
    page.dialog.delete_button.click()
    wait_for(lambda: not folder.exists() and page.views.currentIndex() == 0, timeout=30)
    assert store.get(run_id).adapter is None
    assert page.banner.headline_label.text() == f"Deleted the adapter of run {run_id}."


def test_deleting_an_export_names_it_and_its_size(
    page: ModelsPage, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], pattern_adapter: TrainedAdapter
) -> None:
    run_id = record_returned_run(RunStore(), pattern_adapter.path, base=str(pattern_adapter.base))
    gguf = seed_exports(run_id, pattern_adapter.path) / "model-Q4_K_M.gguf"
    reload(page, qloop)
    assert page.select(gguf)
    page.delete_button.click()
    assert isinstance(page.dialog, ConfirmDeleteDialog)
    assert "GGUF Q4_K_M model-Q4_K_M.gguf (4.68 GB), exported from the adapter of run" in page.dialog.text()
    page.dialog.delete_button.click()
    wait_for(lambda: not gguf.exists(), timeout=30)
    wait_for(lambda: "model-Q4_K_M.gguf" not in [row[0] for row in row_texts(page)], timeout=30)


def test_missing_libraries_are_named_with_the_command_and_block_the_export(
    page: ModelsPage,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    pattern_adapter: TrainedAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record_returned_run(RunStore(), pattern_adapter.path, base=str(pattern_adapter.base))
    reload(page, qloop)
    monkeypatch.setattr(tools, "importable", lambda module: module != "llama_cpp")
    dialog = export_dialog(page)
    assert not dialog.start_button.isEnabled()
    assert any("llama-cpp-python (about 80 MB to download" in line for line in dialog.needs_panel.lines)
    assert dialog.needs_panel.commands == ["rentune tools install"]
    dialog.gguf_check.setChecked(False)
    dialog.merged_check.setChecked(True)  # a merge needs no llama.cpp
    assert dialog.start_button.isEnabled()
    dialog.gguf_check.setChecked(True)
    dialog.refresh_needs()
    install = next(b for b in dialog.needs_panel.findChildren(QPushButton) if b.text() == "&Install local tools")
    monkeypatch.setenv(PYTHON_ENV, "/no/such/python3")  # the install starts on the page, and stops at once here
    install.click()
    assert not dialog.isVisible() and page.task is not None, "the dialog closes; the install runs on the page"
    wait_for(lambda: page.task is None, timeout=60)
    assert page.banner.headline_label.text() == "Installing the local tools did not finish."


def test_the_export_dialog_says_which_outputs_can_be_made_and_a_message_stays_with_its_adapter(
    page: ModelsPage,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    pattern_adapter: TrainedAdapter,
) -> None:
    store = RunStore()
    record_returned_run(store, pattern_adapter.path, base=str(pattern_adapter.base), finished_ago=7200)
    first = record_returned_run(store, pattern_adapter.path, base=str(pattern_adapter.base))
    reload(page, qloop)
    dialog = export_dialog(page)
    # the tiny model's tokenizer is one llama.cpp does not know: said before anything is downloaded or merged
    wait_for(lambda: "Cannot: GGUF" in dialog.verdict_label.text(), timeout=120)
    assert dialog.verdict_label.text().startswith("Can be made: merged model")
    assert "does not recognise the tokenizer" in dialog.verdict_label.text()
    assert not dialog.gguf_check.isEnabled() and not dialog.gguf_check.isChecked()
    assert not dialog.lora_check.isEnabled() and not dialog.ollama_check.isEnabled()
    assert "tokenizer" in dialog.gguf_check.toolTip()
    assert not dialog.start_button.isEnabled() and dialog.hint_label.text() == "Tick at least one thing to export."
    dialog.merged_check.setChecked(True)
    assert dialog.start_button.isEnabled()
    dialog.start_button.click()
    wait_for(lambda: page.task is None, timeout=600)
    assert "Exported" in page.banner.headline_label.text()
    assert page.selected() is not None and page.selected().origin == first
    other = next(row for index, row in page._rows() if page.entries[index].origin != first)
    page.tree.setCurrentItem(other)
    assert not page.banner.isVisibleTo(page)  # it spoke of the other adapter: it no longer shows beside this one


def test_a_base_to_download_is_offered_with_its_size(
    page: ModelsPage,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    pattern_adapter: TrainedAdapter,
    tiny_model: TinyModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import huggingface_hub.constants

    hub = FakeHub().start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        hub.repos["someone/tiny"] = HubRepo(tiny_model.path)
        record_returned_run(RunStore(), pattern_adapter.path, base="someone/tiny")
        reload(page, qloop)
        dialog = export_dialog(page)
        assert any("asking Hugging Face for its size" in line for line in dialog.needs_panel.lines)
        wait_for(lambda: any(" KB)" in line or " MB)" in line for line in dialog.needs_panel.lines), timeout=30)
        assert any(
            "Downloads the base model someone/tiny from Hugging Face first" in line for line in dialog.needs_panel.lines
        )
        assert dialog.start_button.isEnabled()
        dialog.reject()
    finally:
        hub.stop()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_compare_writes_the_report_and_opens_it(
    page: ModelsPage,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    pattern_adapter: TrainedAdapter,
    tmp_path: Path,
    opened: UrlCatcher,
) -> None:
    eval_file = write_pattern_jsonl(tmp_path / "eval.jsonl")
    run_id = record_returned_run(RunStore(), pattern_adapter.path, base=str(pattern_adapter.base), eval_file=eval_file)
    reload(page, qloop)
    page.compare_button.click()
    dialog = page.dialog
    assert isinstance(dialog, CompareDialog) and dialog.eval_edit.text() == str(eval_file)
    dialog.tokens_spin.setValue(12)
    dialog.regex_edit.setText("(unclosed")  # a broken check is named and blocks the start
    assert "does not compile" in dialog.hint_label.text() and not dialog.start_button.isEnabled()
    dialog.regex_edit.setText(r"\.$")  # every taught answer ends with a full stop
    assert dialog.start_button.isEnabled() and not dialog.general_box.isChecked(), "the general check is asked for"
    dialog.general_box.setChecked(True)
    dialog.start_button.click()
    wait_for(lambda: page.task is None, timeout=300)

    report = exports_folder(run_id) / "compare" / "report.html"
    assert report.is_file(), page.banner.details_label.text()
    shown = page.report_dialog
    assert shown is not None and shown.isVisible(), "the report opens in the app"
    assert shown.verdict.headline_label.text().startswith("Leaning better, not yet clear")
    assert "Mean loss on the reference answers" in shown.verdict.details_label.text()
    assert "world capitals: base " in shown.verdict.details_label.text(), "the general check, from report.json"
    tabs = [shown.tabs.tabText(index).replace("&", "") for index in range(shown.tabs.count())]
    assert tabs[:2] == [f"Fixed ({len(shown.report.fixed)})", "Broken (0)"] and shown.report.fixed
    first = shown.report.fixed[0]
    assert first.prompt in shown.fixed_view.toPlainText() and first.tuned_answer in shown.fixed_view.toPlainText()
    shown.browser_button.click()
    assert [Path(url.toLocalFile()) for url in opened.urls] == [report], "every row and the curves: the browser"
    shown.accept()
    details = page.banner.details_label.text()
    # answers cut at 12 tokens: most of the taught ones fit, none of the base's is right
    assert details.startswith("Leaning better, not yet clear (more held-out rows would tell): "), details
    assert "row(s) fixed, 0 broken" in details and "base 0/4 (0%), tuned" in details
    assert "Match with the reference after normalising" in details and "Mean loss on the reference answers" in details
    assert "The answer matches the given regular expression: base 0/4 (0%)" in details
    kinds = [item.kind for item in scan_exports(exports_folder(run_id))]
    assert kinds == [ExportKind.COMPARE_REPORT]  # its report.md and report.json beside it are one report
    wait_for(lambda: row_texts(page)[-1][:2] == ["compare/report.html", "Compare report"], timeout=30)
    assert page.report_button.isEnabled()
    page.report_button.click()
    assert page.report_dialog is not shown and page.report_dialog is not None and page.report_dialog.isVisible()
    page.report_dialog.accept()


def test_open_folder_opens_the_adapters_folder(
    page: ModelsPage, qloop: asyncio.AbstractEventLoop, pattern_adapter: TrainedAdapter, opened: UrlCatcher
) -> None:
    store = RunStore()
    run_id = record_returned_run(store, pattern_adapter.path)
    reload(page, qloop)
    page.folder_button.click()
    assert [Path(url.toLocalFile()) for url in opened.urls] == [Path(store.get(run_id).adapter or "")]


def test_keyboard_alone_opens_the_export_dialog_and_escape_closes_it(
    page: ModelsPage, qtbot: QtBot, qloop: asyncio.AbstractEventLoop, pattern_adapter: TrainedAdapter
) -> None:
    record_returned_run(RunStore(), pattern_adapter.path)
    reload(page, qloop)
    page.tree.setFocus()
    qtbot.keyClick(page.tree, Qt.Key.Key_Return)
    assert isinstance(page.dialog, ExportDialog) and page.dialog.isVisible()
    qtbot.keyClick(page.dialog, Qt.Key.Key_Escape)
    assert not page.dialog.isVisible()
    names = [
        w.accessibleName()
        for w in (
            page.export_button,
            page.compare_button,
            page.chat_button,
            page.report_button,
            page.folder_button,
            page.delete_button,
            page.tree,
        )
    ]
    assert all(names)


def test_service_messages_lose_their_command_line_hints() -> None:
    assert people_words("the adapter does not say which base model it was trained on; pass --base MODEL") == (
        "The adapter does not say which base model it was trained on; choose the base model it was trained on."
    )
    assert "--" not in people_words("x is not a GGUF file; pass a .gguf model (rentune export --gguf Q4_K_M)")
    assert "rentune" not in people_words("the adapter is damaged: bring it home again (rentune pull RUN)")


def test_the_local_tools_line_says_built_in_here_and_install_failures_are_a_sentence(
    page: ModelsPage, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    reload(page, qloop)
    bar = page.tools_bar
    wait_for(lambda: bar.status is not None, timeout=30)
    assert bar.badge.text() == "Local tools built in" and not bar.install_button.isVisibleTo(page)  # the test venv
    monkeypatch.setattr(tools, "importable", lambda module: module != "torch")
    page.reload_tools()
    wait_for(lambda: bar.install_button.isVisibleTo(page), timeout=30)
    assert bar.badge.text() == "Local tools not installed" and "about 1.5 GB" in bar.detail_label.text()
    monkeypatch.setenv(PYTHON_ENV, "/no/such/python3")
    bar.install_button.click()
    assert page.task is not None and page.task_card.isVisible()
    wait_for(lambda: page.task is None, timeout=60)
    assert page.banner.headline_label.text() == "Installing the local tools did not finish."
    assert "needs Python" in page.banner.details_label.text()


def test_tools_from_an_earlier_lock_offer_the_update_that_adds_the_trainer(page: ModelsPage) -> None:
    bar = page.tools_bar
    bar.show_status(ToolsStatus(tools_env().folder, ToolsState.OUTDATED, 2_000_000_000, "3.11"), built_in=False)
    assert bar.badge.text() == "Local tools: an update is ready" and "the trial's trainer" in bar.detail_label.text()
    assert bar.install_button.isVisibleTo(page) and bar.install_button.text() == "&Update local tools…"
    bar.show_status(ToolsStatus(tools_env().folder, ToolsState.ABSENT), built_in=False)
    assert bar.install_button.text() == "&Install local tools…"


def test_removing_the_local_tools_asks_with_their_size_and_frees_them(
    page: ModelsPage, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_installed()
    reload(page, qloop)
    bar = page.tools_bar
    wait_for(lambda: bar.badge.text() == "Local tools installed", timeout=30)
    assert "torch 2.13.0" in bar.detail_label.text() and bar.remove_button.isVisibleTo(page)
    asked: list[str] = []
    monkeypatch.setattr(models_page, "confirm", lambda _parent, _title, question, *_: asked.append(question) or True)
    bar.remove_button.click()
    assert page.task is not None and not bar.install_button.isEnabled() and not bar.remove_button.isEnabled()
    wait_for(lambda: page.task is None and bar.badge.text() == "Local tools built in", timeout=30)  # this venv has them
    assert asked and "Delete the local tools (" in asked[0] and "adapters and exported models are kept" in asked[0]
    assert page.banner.headline_label.text().startswith("Removed the local tools: ") and not tools_env().folder.exists()


def test_a_steps_message_stays_while_the_list_is_rebuilt_under_it(
    page: ModelsPage, qloop: asyncio.AbstractEventLoop, pattern_adapter: TrainedAdapter
) -> None:
    """Rebuilding the list passes the selection over other rows (Qt makes the first row current where the view has
    focus); the message about the adapter still selected must not go with it, as it did after a publish."""
    store = RunStore()
    record_returned_run(store, pattern_adapter.path, base=str(pattern_adapter.base))
    second = record_returned_run(store, pattern_adapter.path, base=str(pattern_adapter.base), finished_ago=7200)
    reload(page, qloop)
    assert page.select(Path(store.get(second).adapter or ""))
    page._told_about = second  # what a step started on that adapter leaves
    page.banner.show_message("success", "Published to somewhere")

    def first_row_current(*_args: object) -> None:
        if page.tree.topLevelItemCount():
            page.tree.setCurrentItem(page.tree.topLevelItem(0))

    page.tree.model().rowsInserted.connect(first_row_current)
    page.show_inventory(page.inventory)
    assert page.selected() is not None and page.selected().origin == second
    assert page.banner.headline_label.text() == "Published to somewhere"


def test_an_older_report_without_its_json_opens_in_the_browser_and_a_damaged_one_is_said(
    page: ModelsPage, opened: UrlCatcher, tmp_path: Path
) -> None:
    html = tmp_path / "compare" / "report.html"
    html.parent.mkdir()
    html.write_text("<html></html>")
    assert page.show_report(html) is None
    assert [Path(url.toLocalFile()) for url in opened.urls] == [html]
    (html.parent / "report.json").write_text("{cut short")
    assert page.show_report(html.parent / "report.json") is None
    assert page.banner.headline_label.text() == "The report cannot be shown."
    assert "compare again to write a new one" in page.banner.details_label.text()
