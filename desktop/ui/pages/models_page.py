"""The models on this computer: every adapter a run brought home and everything exported from it.

Export (merged, GGUF of a chosen type, GGUF LoRA, MLX, Ollama Modelfile), compare base and fine-tuned, open the
folder, chat with an export, serve a GGUF as an OpenAI-compatible endpoint on this computer, delete. The listing
comes from :func:`desktop.services.runs.adapters.read_inventory`; the long steps are the local services, run in the
background with progress and Cancel (which kills their child process and removes what was half-written).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QStackedWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QTreeWidgetItemIterator,
    QVBoxLayout,
    QWidget,
)

from desktop.core.model_names import model_name
from desktop.core.runs.progress import format_duration
from desktop.services.evaluation.judge import JudgeOptions, judge_and_report
from desktop.services.evaluation.report import summary_lines
from desktop.services.evaluation.saved_report import SavedReportError, read_saved_report
from desktop.services.local.common import LocalToolError
from desktop.services.local.export import ExportRequest, ExportResult, export
from desktop.services.local.inventory import COMPARE_FOLDER, ExportedItem, ExportKind, remove_export
from desktop.services.local.toolenv import ToolsStatus, frozen, install_tools, remove_tools, tools_status
from desktop.services.local.tools import LocalStep, missing_tools
from desktop.services.publishing.hub import Published, PublishRequest, publish
from desktop.services.runs.adapters import Inventory, ReturnedAdapter, delete_adapter, read_inventory
from desktop.services.runs.run_facts import run_facts_of
from desktop.services.runs.store import RunLiveError, UnknownRunError
from desktop.services.serving.local_server import LocalServer
from desktop.ui.app_words import sentence
from desktop.ui.background import CoroutineOperation, Job, Operation, Running
from desktop.ui.context import AppContext
from desktop.ui.pages.base import BasePage
from desktop.ui.widgets.blocks import Banner, EmptyState, caption, destructive_button, plain_button, primary_button
from desktop.ui.widgets.confirm_delete import ConfirmDeleteDialog
from desktop.ui.widgets.dialogs import confirm
from desktop.ui.widgets.flow_layout import FlowLayout
from desktop.ui.widgets.local_dialogs import CompareChoice, CompareDialog, ExportDialog
from desktop.ui.widgets.local_words import (
    adapter_kind,
    adapter_loss,
    adapter_summary,
    adapter_title,
    export_loss,
    item_name,
    kind_text,
    people_words,
    size_text,
    spend_text,
)
from desktop.ui.widgets.publish_dialog import PublishDialog
from desktop.ui.widgets.report_dialog import ReportDialog, report_title
from desktop.ui.widgets.serve_panel import ServeCard, ServeChoice, ServeDialog
from desktop.ui.widgets.task_card import TaskCard
from desktop.ui.widgets.tools_bar import ToolsBar

COLUMNS = ("Name", "What", "Size", "Training and cost")


@dataclass(frozen=True)
class ModelEntry:
    """What a row of the list stands for: an adapter, or an export (with the adapter it came from, if here).

    Attributes:
        origin: The export folder name it belongs to (a run id, ``RUN-step-N`` for a checkpoint).
        adapter: The adapter of that run, when it is on this computer.
        item: The export, for an export row; None for the adapter's own row (or a group of leftovers).
    """

    origin: str
    adapter: ReturnedAdapter | None
    item: ExportedItem | None = None


def _progress(job: Job) -> Callable[[str, float | None], None]:
    """A service progress callback that reaches the page (safe from any thread)."""
    return lambda text, fraction: job.report((text, fraction))


def export_summary(result: ExportResult) -> str:
    """What an export wrote, one output per line."""
    written = [
        *([("Merged model", result.merged)] if result.merged else []),
        *((f"GGUF {qtype}", path) for qtype, path in result.gguf.items()),
        *([("GGUF LoRA", result.lora_gguf)] if result.lora_gguf else []),
        *([("Base model as GGUF", result.base_gguf)] if result.base_gguf else []),
        *([("Ollama Modelfile", result.modelfile)] if result.modelfile else []),
        *([("MLX model", result.mlx)] if result.mlx else []),
    ]
    lines = [f"{label}: {path}" for label, path in written]
    return "\n".join(lines + [f"Note: {note}" for note in result.notes])


class ModelsPage(BasePage):
    """Lists the adapters and exports; acts on the selected one.

    Signals:
        sig_chat: Chat with a model: the model's path and a GGUF LoRA's path ("" for none).
        sig_new_run: The user asked to start a fine-tune (from the empty state).
    """

    page_name = "models"
    title = "Models"
    icon_name = "boxes"
    scrolls = False
    purpose = (
        "The adapters and checkpoints your runs brought home, and every model exported from them. Export one for "
        "llama.cpp, Ollama or MLX, compare it with its base, chat with it, or serve it to your programs."
    )
    sig_chat = Signal(str, str)
    sig_new_run = Signal()

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        self.context = context
        self.inventory = Inventory()
        self.entries: list[ModelEntry] = []
        self.task: Running[Any] | None = None
        self.dialog: QDialog | None = None
        self._after: Path | None = None
        self.report_dialog: ReportDialog | None = None
        self._what = ""
        self._cancelled = False
        self._told_about: str | None = None  # the adapter (export folder name) the banner's message is about
        self._stopping: LocalServer | None = None  # the server the user asked to stop (its end is no surprise)
        super().__init__(parent)
        self.banner = Banner()
        self.body.addWidget(self.banner)
        self.tools_bar = ToolsBar()
        self.tools_bar.sig_install.connect(self.on_install_tools)
        self.tools_bar.sig_remove.connect(self.on_remove_tools)
        self.body.addWidget(self.tools_bar)
        self.views = QStackedWidget()
        self.views.addWidget(self._build_empty())
        self.views.addWidget(self._build_list())
        self.body.addWidget(self.views, 1)
        self.serve_card = ServeCard()
        self.serve_card.sig_stop.connect(self.on_stop_serving)
        self.body.addWidget(self.serve_card)
        self.requests_timer = QTimer(self)
        self.requests_timer.setInterval(1000)
        self.requests_timer.timeout.connect(self.serve_card.refresh)
        self.task_card = TaskCard()
        self.task_card.sig_cancel.connect(self.on_cancel)
        self.body.addWidget(self.task_card)

    # -- layout -------------------------------------------------------------------------------------------------

    def _build_empty(self) -> QWidget:
        button = primary_button("Start a &new fine-tune", "plus")
        button.clicked.connect(lambda _checked=False: self.sig_new_run.emit())
        return EmptyState(
            "boxes",
            "No models here yet",
            "When a run finishes, its adapter comes home and appears here, with what it cost; a stopped run's "
            "checkpoints appear too. From here you export "
            "it (GGUF for llama.cpp and Ollama, MLX, a merged model), compare it with its base and chat with it.",
            button,
        )

    def _build_list(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.tree = QTreeWidget()
        self.tree.setAccessibleName("Adapters and exported models")
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setStyleSheet("QTreeView::item { padding: 5px 2px; }")  # roomier rows; colours stay the theme's
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2, 3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.itemSelectionChanged.connect(self.on_selection_changed)
        self.tree.itemActivated.connect(lambda _item, _column: self.on_item_activated())
        layout.addWidget(self.tree, 1)
        self.detail_label = caption()
        self.detail_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.detail_label.setAccessibleName("About the selected model")
        layout.addWidget(self.detail_label)
        layout.addLayout(self._build_actions())
        return box

    def _build_actions(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.export_button = primary_button("E&xport…", "download", "Export the selected adapter")
        self.compare_button = plain_button("&Compare…", "git-compare", "Compare base and fine-tuned")
        self.chat_button = plain_button("C&hat", "message-square", "Chat with the selected model")
        self.serve_button = plain_button("Ser&ve…", "server", "Serve the selected model to your programs")
        self.publish_button = plain_button("P&ublish…", "cloud", "Publish the selected adapter to the Hugging Face Hub")
        self.report_button = plain_button("Open &report", "file-text", "Open the compare report")
        self.folder_button = plain_button("&Open folder", "folder-open", "Open the selected model's folder")
        self.delete_button = destructive_button("&Delete…", "trash-2", "Delete the selected model")
        actions = (
            (self.export_button, self.on_export_clicked),
            (self.compare_button, self.on_compare_clicked),
            (self.chat_button, self.on_chat_clicked),
            (self.serve_button, self.on_serve_clicked),
            (self.publish_button, self.on_publish_clicked),
            (self.report_button, self.on_report_clicked),
            (self.folder_button, self.on_folder_clicked),
        )
        flow_box = QWidget()  # the actions wrap onto a second row where the window is narrow, never cut short
        flow = FlowLayout(flow_box)
        for button, handler in actions:
            button.clicked.connect(lambda _checked=False, act=handler: act())
            flow.addWidget(button)
        row.addWidget(flow_box, 1)
        self.delete_button.clicked.connect(lambda _checked=False: self.on_delete_clicked())
        row.addWidget(self.delete_button, 0, Qt.AlignmentFlag.AlignTop)
        return row

    # -- the listing --------------------------------------------------------------------------------------------

    async def load(self) -> None:
        """Reads the adapters and exports (off the UI thread) and shows them."""
        store = self.context.store
        self.reload_tools()
        await Operation(self, lambda _job: read_inventory(store), self.show_inventory, group="inventory").run().wait()

    def reload(self) -> None:
        """Reads the listing (and what the local tools hold) again in the background."""
        store = self.context.store
        self.reload_tools()
        Operation(self, lambda _job: read_inventory(store), self.show_inventory, group="inventory").run()

    def reload_tools(self) -> None:
        """Reads the local tools' status in the background (it adds up the folder's size)."""
        Operation(self, lambda _job: tools_status(), self.show_tools, group="tools").run()

    def show_tools(self, status: ToolsStatus) -> None:
        """Draws the local tools' line."""
        self.tools_bar.show_status(status, built_in=self._tools_built_in(), busy=self.task is not None)

    @staticmethod
    def _tools_built_in() -> bool:
        return not frozen() and not missing_tools([LocalStep.GGUF, LocalStep.CHAT_GGUF, LocalStep.MERGE])

    def showEvent(self, event: QShowEvent) -> None:
        """Refreshes the listing whenever the page comes into view (a run may have finished meanwhile)."""
        super().showEvent(event)
        if self.task is None:
            self.reload()

    def show_inventory(self, inventory: Inventory) -> None:
        """Draws ``inventory``, keeping the selection where it can."""
        selected = self.selected()
        self.inventory = inventory
        self.views.setCurrentIndex(0 if inventory.empty else 1)
        # Rebuilding passes the selection over other rows; only where it lands counts (a step's message about the
        # adapter still selected must stay), so the tree is silent until then.
        self.tree.blockSignals(True)
        self.tree.clear()
        self.entries = []
        for adapter in inventory.adapters:
            parent = self._add_row(None, ModelEntry(adapter.export_name, adapter), self._adapter_cells(adapter))
            for item in adapter.exports:
                self._add_row(parent, ModelEntry(adapter.export_name, adapter, item), self._item_cells(item))
        for name, items in inventory.leftovers.items():
            cells = (f"Exports of {name}", "Adapter deleted", "", "")
            parent = self._add_row(None, ModelEntry(name, None), cells)
            for item in items:
                self._add_row(parent, ModelEntry(name, None, item), self._item_cells(item))
        self.tree.expandAll()
        self._reselect(selected)
        if self.task is None and self._after is not None and self.select(self._after):
            self._after = None
        self.tree.blockSignals(False)
        self.on_selection_changed()

    def _adapter_cells(self, adapter: ReturnedAdapter) -> tuple[str, ...]:
        base = model_name(adapter.source.base) if adapter.source.base else "unknown base"
        training = f"{format_duration(adapter.trained_seconds)} · {spend_text(adapter)}"
        step = f" · step {adapter.step}" if adapter.step is not None else ""
        return (f"Run {adapter.run_id}{step} · {base}", adapter_kind(adapter), size_text(adapter.bytes), training)

    def _item_cells(self, item: ExportedItem) -> tuple[str, ...]:
        return (item_name(item), kind_text(item), size_text(item.bytes), "")

    def _add_row(self, parent: QTreeWidgetItem | None, entry: ModelEntry, cells: tuple[str, ...]) -> QTreeWidgetItem:
        row = QTreeWidgetItem(list(cells))
        row.setData(0, Qt.ItemDataRole.UserRole, len(self.entries))
        path = entry.item.path if entry.item else entry.adapter.source.adapter if entry.adapter else None
        base = entry.adapter.source.base if entry.adapter and entry.item is None else ""
        lines = [cells[0], *([f"Base model: {base}"] if base and model_name(base) != base else []), str(path or "")]
        row.setToolTip(0, "\n".join(line for line in lines if line))
        row.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.entries.append(entry)
        if parent is None:
            font = row.font(0)
            font.setBold(True)
            row.setFont(0, font)
            self.tree.addTopLevelItem(row)
        else:
            parent.addChild(row)
        return row

    def _reselect(self, selected: ModelEntry | None) -> None:
        rows = self._rows()
        keys = [_key(self.entries[index]) for index, _row in rows]
        wanted = _key(selected) if selected is not None else None
        if wanted in keys:
            self.tree.setCurrentItem(rows[keys.index(wanted)][1])
        elif rows:
            self.tree.setCurrentItem(rows[0][1])

    def _rows(self) -> list[tuple[int, QTreeWidgetItem]]:
        found = []
        iterator = QTreeWidgetItemIterator(self.tree)
        while (row := iterator.value()) is not None:
            found.append((int(row.data(0, Qt.ItemDataRole.UserRole)), row))
            iterator += 1
        return found

    def select(self, path: Path) -> bool:
        """Selects the row of the adapter or export at ``path``; False when none is listed there."""
        for index, row in self._rows():
            entry = self.entries[index]
            shown = entry.item.path if entry.item else entry.adapter.source.adapter if entry.adapter else None
            if shown is not None and shown.resolve() == path.resolve():
                self.tree.setCurrentItem(row)
                return True
        return False

    def select_when_listed(self, path: Path) -> None:
        """Selects the adapter or export at ``path`` once the listing being read now (or next) shows it."""
        if not self.select(path):
            self._after = path

    def selected(self) -> ModelEntry | None:
        """What the selected row stands for."""
        row = self.tree.currentItem() if self.views.currentIndex() == 1 else None
        if row is None:
            return None
        return self.entries[int(row.data(0, Qt.ItemDataRole.UserRole))]

    # -- what the selection allows ------------------------------------------------------------------------------

    def on_selection_changed(self) -> None:
        """Enables the actions the selected row allows and describes it.

        A finished step's message about another adapter goes: it would read as being about this one.
        """
        entry = self.selected()
        moved_on = entry is not None and entry.origin != self._told_about  # none: the list is being read again
        if self.task is None and self._told_about is not None and moved_on:
            self.banner.show_message("info", "")
            self._told_about = None
        busy = self.task is not None
        adapter = entry.adapter if entry else None
        item = entry.item if entry else None
        self.export_button.setEnabled(adapter is not None and not busy)
        self.compare_button.setEnabled(adapter is not None and not busy)
        self.publish_button.setEnabled(adapter is not None and entry is not None and entry.item is None and not busy)
        self.chat_button.setEnabled(item is not None and self._chat_target(entry) is not None)
        serving = bool(self.context.servers.running())
        self.serve_button.setEnabled(self._serve_target(entry) is not None and not busy and not serving)
        self.report_button.setEnabled(self._report(entry) is not None)
        self.folder_button.setEnabled(entry is not None and (item is not None or adapter is not None))
        deletable = item is not None or (adapter is not None and not adapter.is_checkpoint)
        self.delete_button.setEnabled(entry is not None and deletable and not busy)
        self.detail_label.setText(self._detail(entry))

    def _detail(self, entry: ModelEntry | None) -> str:
        if entry is None:
            return ""
        if entry.item is not None:
            return f"{kind_text(entry.item)}, {size_text(entry.item.bytes)}: {entry.item.path}"
        if entry.adapter is not None and entry.adapter.is_checkpoint:
            kept = "It stays with its run (Resume continues from it); deleting the run on the Runs page frees it."
            return f"{adapter_summary(entry.adapter)}\n{kept}"
        if entry.adapter is not None:
            return adapter_summary(entry.adapter)
        return f"Exported from {entry.origin}, whose adapter was deleted from this computer."

    def _chat_target(self, entry: ModelEntry | None) -> tuple[Path, Path | None] | None:
        """The model (and LoRA) to chat with for the selected export, if it can be chatted with."""
        item = entry.item if entry else None
        if item is None or entry is None:
            return None
        if item.chat_engine is not None:
            return item.path, None
        if item.kind is ExportKind.GGUF_LORA:
            bases = [i for _, i in self.inventory.all_exports() if i.of_base and i.path.parent == item.path.parent]
            return (bases[0].path, item.path) if bases else None
        return None

    def _serve_target(self, entry: ModelEntry | None) -> tuple[Path, Path | None] | None:
        """The GGUF (and GGUF LoRA) to serve for the selected export; None for anything else (MLX, folders)."""
        target = self._chat_target(entry)
        if target is None or entry is None or entry.item is None or entry.item.kind is ExportKind.MLX:
            return None
        return target

    def _report(self, entry: ModelEntry | None) -> Path | None:
        if entry is None:
            return None
        if entry.item is not None:
            return entry.item.path if entry.item.kind is ExportKind.COMPARE_REPORT else None
        exports = entry.adapter.exports if entry.adapter else ()
        return next((i.path for i in exports if i.kind is ExportKind.COMPARE_REPORT), None)

    def on_item_activated(self) -> None:
        """Enter or a double-click: opens a report, chats with a model, or exports an adapter."""
        entry = self.selected()
        if entry is None:
            return
        if entry.item is not None and entry.item.kind is ExportKind.COMPARE_REPORT:
            self.on_report_clicked()
        elif self._chat_target(entry) is not None:
            self.on_chat_clicked()
        elif entry.item is None and entry.adapter is not None and self.task is None:
            self.on_export_clicked()

    # -- export and compare -------------------------------------------------------------------------------------

    def on_export_clicked(self) -> None:
        """Asks what to export (showing what it needs first), then exports in the background."""
        entry = self.selected()
        if entry is None or entry.adapter is None or self.task is not None:
            return
        adapter = entry.adapter
        dialog = ExportDialog(self, adapter, self.context.secrets)
        dialog.sig_install_tools.connect(self.on_install_tools)
        dialog.accepted.connect(lambda: self.start_export(adapter, dialog.request()))
        self._open(dialog)

    def start_export(self, adapter: ReturnedAdapter, request: ExportRequest) -> None:
        """Exports ``request`` with progress and Cancel."""
        self._start(
            f"Exporting {adapter_title(adapter)}",
            lambda job: export(request, _progress(job)),
            self._exported,
            "Export",
        )

    def _exported(self, result: ExportResult) -> None:
        self.banner.show_message("success", "Exported. The new files are listed below.", export_summary(result))
        written = next(iter(result.gguf.values()), None) or result.lora_gguf or result.merged or result.mlx
        self._after = written

    def on_compare_clicked(self) -> None:
        """Asks what to compare on (showing what it needs first), then compares in the background."""
        entry = self.selected()
        if entry is None or entry.adapter is None or self.task is not None:
            return
        adapter = entry.adapter
        dialog = CompareDialog(self, adapter, self.context.secrets)
        dialog.sig_install_tools.connect(self.on_install_tools)
        dialog.accepted.connect(lambda: self.start_compare(adapter, dialog.choice()))
        self._open(dialog)

    def start_compare(self, adapter: ReturnedAdapter, choice: CompareChoice) -> None:
        """Judges base against fine-tuned on ``choice`` with progress and Cancel; opens the report when written."""
        out = adapter.export_folder / COMPARE_FOLDER
        options = JudgeOptions(
            choice.regex, choice.schema_file, choice.max_examples, choice.max_new_tokens, general=choice.general
        )
        store = self.context.store

        async def work(job: Job) -> Any:
            run = await run_facts_of(store, adapter.run_id)
            return await judge_and_report(
                choice.base,
                adapter.source.adapter,
                choice.eval_file,
                out,
                options=options,
                run=run,
                progress=_progress(job),
                secrets=self.context.secrets,
            )

        self._start(f"Comparing {adapter_title(adapter)} with its base", work, self._compared, "Comparison")

    def _compared(self, outcome: tuple[Any, dict[str, Path]]) -> None:
        judgement, written = outcome
        self.banner.show_message("success", "Compared. The report is open.", "\n".join(summary_lines(judgement)))
        self._after = written["html"]
        self.show_report(written["json"])

    # -- the local tools ----------------------------------------------------------------------------------------

    def on_install_tools(self) -> None:
        """Installs the local tools with progress and Cancel (running it again finishes an interrupted install)."""
        if self.task is not None:
            return
        self._start(
            "Installing the local tools (torch, transformers, peft, llama.cpp)",
            lambda job: install_tools(_progress(job)),
            self._tools_installed,
            "Installing the local tools",
            note="Cancel stops it at once; Install again later finishes what was begun.",
        )

    def _tools_installed(self, status: ToolsStatus) -> None:
        listed = ", ".join(f"{name} {version}" for name, version in status.packages.items())
        headline = "The local tools are installed: export and chat work now."
        self.banner.show_message("success", headline, f"{size_text(status.size_bytes)}: {listed}")

    def on_remove_tools(self) -> None:
        """Asks, naming the space and what stops working, then deletes the local tools (with progress)."""
        status = self.tools_bar.status
        if status is None or self.task is not None:
            return
        question = (
            f"Delete the local tools ({size_text(status.size_bytes)}) from {status.folder}?\n\nExport and chat need "
            "them; installing them again takes a few minutes. Your adapters and exported models are kept."
        )
        if not confirm(self, "Remove the local tools", question, "&Remove them", "&Keep them"):
            return
        self._start(
            "Removing the local tools",
            lambda _job: asyncio.to_thread(remove_tools),
            lambda freed: self.banner.show_message("success", f"Removed the local tools: {size_text(freed)} freed."),
            "Removing the local tools",
            note="What is left of them after a Cancel is removed by Remove again.",
        )

    # -- running a step -----------------------------------------------------------------------------------------

    def _start(
        self,
        title: str,
        work: Callable[[Job], Awaitable[Any]],
        done: Callable[[Any], None],
        what: str,
        note: str = "Cancel stops it at once; nothing half-written is kept.",
    ) -> None:
        self.banner.show_message("info", "")
        self._after = None
        self._what = what
        started_on = self.selected()
        self._told_about = started_on.origin if started_on is not None else None
        self._cancelled = False
        self.task_card.start(title, note)
        if self.tools_bar.status is not None:  # its buttons wait for the step to end
            self.tools_bar.show_status(self.tools_bar.status, built_in=self._tools_built_in(), busy=True)
        self.task = (
            CoroutineOperation(self, work, done, group="task")
            .with_progress(self.task_card.show_progress)
            .failure(self._failed, LocalToolError, OSError)
            .run()
        )
        self.task.task.add_done_callback(lambda _task: self._ended())
        self.on_selection_changed()

    def _failed(self, exc: Exception) -> None:
        self.banner.show_message("danger", f"{self._what} did not finish.", people_words(str(exc)))

    def on_cancel(self) -> None:
        """Stops the step in progress: its child process is killed and what it half-wrote removed."""
        if self.task is None:
            return
        self._cancelled = True
        self.task_card.stopping()
        self.task.cancel()

    def _ended(self) -> None:
        if not shiboken6.isValid(self):  # the window closed while the step ran
            return
        self.task = None
        self.task_card.finish()
        if self._cancelled:
            self.banner.show_message("info", f"{self._what} cancelled.", "Nothing half-written was kept.")
        after = self._after
        store = self.context.store

        def shown(inventory: Inventory) -> None:
            self.show_inventory(inventory)
            if after is not None:
                self.select(after)

        Operation(self, lambda _job: read_inventory(store), shown, group="inventory").run()
        self.reload_tools()
        self.on_selection_changed()

    # -- publishing ---------------------------------------------------------------------------------------------

    def on_publish_clicked(self) -> None:
        """Asks where to publish the selected adapter and what to add, then publishes with progress and Cancel."""
        entry = self.selected()
        if entry is None or entry.adapter is None or entry.item is not None or self.task is not None:
            return
        adapter = entry.adapter
        dialog = PublishDialog(self, adapter, self.context.secrets)
        dialog.accepted.connect(lambda: self.start_publish(adapter, dialog.request()))
        self._open(dialog)

    def start_publish(self, adapter: ReturnedAdapter, request: PublishRequest) -> None:
        """Publishes ``request``; the banner says where it went."""
        secrets, store = self.context.secrets, self.context.store
        self._start(
            f"Publishing {adapter_title(adapter)} to the Hugging Face Hub",
            lambda job: publish(request, secrets, store=store, progress=_progress(job)),
            self._published,
            "Publishing",
            note="Cancel stops the upload; nothing is committed until every file is there, and publishing again "
            "sends only what the Hub lacks.",
        )

    def _published(self, published: Published) -> None:
        files = "\n".join(published.files)
        self.banner.show_message(
            "success", f"Published to {published.url}", f"Commit {published.commit[:12]}:\n{files}"
        )

    # -- serving ------------------------------------------------------------------------------------------------

    def on_serve_clicked(self) -> None:
        """Asks for the port, then starts an OpenAI-compatible server for the selected GGUF."""
        target = self._serve_target(self.selected())
        if target is None or self.task is not None or self.context.servers.running():
            return
        dialog = ServeDialog(self, *target)
        dialog.accepted.connect(lambda: self.start_serving(dialog.choice()))
        self._open(dialog)

    def start_serving(self, choice: ServeChoice) -> None:
        """Starts the server with progress and Cancel; the serving card shows it once it answers."""
        servers = self.context.servers

        async def work(job: Job) -> LocalServer:
            job.report(("loading the model; the server answers once it is loaded", None))
            return await servers.start(choice.model, port=choice.port, lora=choice.lora, context=choice.context)

        note = "Cancel stops the server before it answers."
        self._start(f"Starting a server for {choice.model.name}", work, self._serving, "Starting the server", note)

    def _serving(self, server: LocalServer) -> None:
        self.serve_card.show_server(server)
        self.requests_timer.start()
        CoroutineOperation(self, lambda _job: server.wait(), lambda code: self._server_ended(server, code)).run()

    def _server_ended(self, server: LocalServer, code: int) -> None:
        """The server's process ended: said as a problem unless the user stopped it."""
        if server is self._stopping:
            return
        self.requests_timer.stop()
        self.serve_card.finish()
        self.context.servers.forget(server)
        tail = " | ".join(line for line in server.output if line.strip())[-600:]
        self.banner.show_message("danger", f"The server for {server.model.name} ended (exit {code}).", tail)
        self.on_selection_changed()

    def on_stop_serving(self) -> None:
        """Stops the server shown and says how many requests it answered."""
        server = self.serve_card.server
        if server is None or self._stopping is server:
            return
        self._stopping = server
        self.serve_card.stopping()

        def stopped(_result: object) -> None:
            self._stopping = None
            self.requests_timer.stop()
            self.serve_card.finish()
            count = f"{server.requests} request" + ("" if server.requests == 1 else "s")
            self.banner.show_message("info", f"Stopped serving {server.model.name} after {count}.")
            self.on_selection_changed()

        CoroutineOperation(self, lambda _job: self.context.servers.stop(server), stopped, group="serve-stop").run()

    # -- chat, open, delete -------------------------------------------------------------------------------------

    def on_chat_clicked(self) -> None:
        """Opens the chat with the selected export (a GGUF LoRA goes with the base GGUF beside it)."""
        target = self._chat_target(self.selected())
        if target is not None:
            model, lora = target
            self.sig_chat.emit(str(model), str(lora) if lora else "")

    def on_report_clicked(self) -> None:
        """Shows the selected compare report in the app."""
        report = self._report(self.selected())
        if report is not None:
            self.show_report(report)

    def show_report(self, report: Path) -> ReportDialog | None:
        """The report in the app (its verdict, scores, loss curve and flips); an older one opens in the browser."""
        try:
            saved = read_saved_report(report)
        except SavedReportError as exc:
            if report.suffix == ".html":
                self._open_url(report, "the report")
            else:
                self.banner.show_message("warning", "The report cannot be shown.", sentence(str(exc)))
            return None
        if self.report_dialog is not None:
            self.report_dialog.deleteLater()  # each report opened made a new window the page kept until it closed
        self.report_dialog = ReportDialog(self, saved, report_title(report))
        self.report_dialog.open()
        return self.report_dialog

    def on_folder_clicked(self) -> None:
        """Opens the selected adapter's or export's folder in the file manager."""
        entry = self.selected()
        if entry is None:
            return
        folder = entry.item.folder if entry.item else entry.adapter.source.adapter if entry.adapter else None
        if folder is not None:
            self._open_url(folder, "a file manager")

    def _open_url(self, path: Path, what: str) -> None:
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
            self.banner.show_message("info", f"Could not open {what}.", f"It is at {path}")

    def on_delete_clicked(self) -> None:
        """Asks, naming exactly what is lost, then deletes the selected adapter or export."""
        entry = self.selected()
        if entry is None or self.task is not None:
            return
        if entry.item is not None:
            self._ask_delete_export(entry, entry.item)
        elif entry.adapter is not None and not entry.adapter.is_checkpoint:
            self._ask_delete_adapter(entry.adapter)

    def _ask_delete_adapter(self, adapter: ReturnedAdapter) -> None:
        if not adapter.ended or self.context.manager.is_driving(adapter.run_id):
            self.banner.show_message(
                "warning",
                f"Run {adapter.run_id} is still going.",
                "Its adapter can be deleted once the run has ended (stop it from the monitor).",
            )
            return
        exports = f" The {len(adapter.exports)} model(s) exported from it stay." if adapter.exports else ""
        dialog = ConfirmDeleteDialog(
            self,
            f"Delete the adapter of run {adapter.run_id}?",
            [adapter_loss(adapter), _adapter_facts(adapter)],
            f"The run's record and checkpoints stay on the Runs page.{exports}",
            "&Delete adapter",
        )
        store, run_id = self.context.store, adapter.run_id
        dialog.accepted.connect(
            lambda: self._delete(lambda: delete_adapter(store, run_id), f"Deleted the adapter of run {run_id}.")
        )
        self._open(dialog)

    def _ask_delete_export(self, entry: ModelEntry, item: ExportedItem) -> None:
        origin = adapter_title(entry.adapter) if entry.adapter else f"{entry.origin} (its adapter is gone)"
        losses = [export_loss(item, origin)]
        if entry.adapter is None:
            losses = [
                f"{kind_text(item)} {item_name(item)} ({size_text(item.bytes)}): its adapter is no longer "
                "on this computer, so it cannot be exported again."
            ]
        dialog = ConfirmDeleteDialog(self, f"Delete {item_name(item)}?", losses, "", "&Delete")
        dialog.accepted.connect(lambda: self._delete(lambda: remove_export(item), f"Deleted {item_name(item)}."))
        self._open(dialog)

    def _delete(self, work: Callable[[], object], done: str) -> None:
        def deleted(_result: object) -> None:
            self.banner.show_message("success", done)
            self.reload()

        def failed(exc: Exception) -> None:
            self.banner.show_message("danger", "Not deleted.", people_words(str(exc)))

        errors = (LocalToolError, RunLiveError, UnknownRunError, OSError)
        Operation(self, lambda _job: work(), deleted, group="delete").failure(failed, *errors).run()

    def _open(self, dialog: QDialog) -> None:
        """Shows a dialog without blocking the event loop (the page keeps it while it is open)."""
        self.dialog = dialog
        dialog.open()


def _adapter_facts(adapter: ReturnedAdapter) -> str:
    base = adapter.source.base or "an unnamed base model"
    return f"It is {size_text(adapter.bytes)} in {adapter.source.adapter}, trained on {base}."


def _key(entry: ModelEntry | None) -> tuple[str, str] | None:
    if entry is None:
        return None
    return entry.origin, str(entry.item.path) if entry.item else ""
