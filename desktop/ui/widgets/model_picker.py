"""Choosing a model file for the chat: the exported models listed, or a GGUF file or MLX folder chosen by hand."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QMenu, QSizePolicy, QWidget

from desktop.services.local.inventory import ExportedItem, ExportKind
from desktop.services.runs.adapters import ReturnedAdapter
from desktop.ui.widgets.blocks import plain_button
from desktop.ui.widgets.local_words import kind_text, size_text


def origin_words(origin: ReturnedAdapter | str, item: ExportedItem) -> str:
    """Which adapter an export came from: ``final adapter of run abc``, ``step-20 checkpoint of run abc``.

    A run's final adapter and its checkpoints export files of the same names; these words tell them apart. A base
    model's GGUF says it is the base; a folder whose run is gone says its folder name (``abc-step-20``).
    """
    if isinstance(origin, str):
        return origin
    if item.of_base:
        step = "" if origin.step is None else f" (step {origin.step})"
        return f"base model, exported with run {origin.run_id}{step}"
    if origin.step is None:
        return f"final adapter of run {origin.run_id}"
    return f"step-{origin.step} checkpoint of run {origin.run_id}"


def item_label(origin: ReturnedAdapter | str, item: ExportedItem) -> str:
    """A choice's words: the file name (an MLX folder says so), the adapter it came from and its size."""
    name = f"{item.path.name} ({kind_text(item)})" if item.kind is ExportKind.MLX else item.path.name
    return f"{name} — {origin_words(origin, item)}, {size_text(item.bytes)}"


class ModelPicker(QWidget):
    """A list of models (or GGUF LoRAs) plus Browse; ``sig_picked`` when the user picks one (not when code does).

    Args:
        name: What is picked, for screen readers ("Model", "LoRA").
        loras: Pick GGUF LoRAs (with a "No LoRA" choice) instead of models.
    """

    sig_picked = Signal()

    def __init__(self, name: str, *, loras: bool = False, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.loras = loras
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.combo = QComboBox()
        self.combo.setAccessibleName(name)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(18)
        self.combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.combo.activated.connect(lambda _index: self.sig_picked.emit())
        self.browse_button = plain_button("", "folder-open", f"Choose the {name.lower()} from a file")
        self.browse_button.setToolTip("Browse for a file" if loras else "Browse for a GGUF file or an MLX folder")
        if loras:
            self.browse_button.clicked.connect(lambda _checked=False: self.on_choose_file())
        else:
            menu = QMenu(self.browse_button)
            menu.addAction("A GGUF file…", self.on_choose_file)
            menu.addAction("An MLX model folder…", self.on_choose_folder)
            self.browse_button.setMenu(menu)
        row.addWidget(self.combo, 1)
        row.addWidget(self.browse_button)
        self.set_items([])

    def set_items(self, items: list[tuple[ReturnedAdapter | str, ExportedItem]]) -> None:
        """Lists the exports that fit (models, or LoRAs), keeping the current choice."""
        current = self.path()
        self.combo.clear()
        wanted = (ExportKind.GGUF_LORA,) if self.loras else (ExportKind.GGUF, ExportKind.MLX)
        fitting = [(origin, item) for origin, item in items if item.kind in wanted and not item.damaged]
        if self.loras:
            self.combo.addItem("No LoRA", "")
        else:
            self.combo.addItem("Choose a model…" if fitting else "No exported model yet", "")
        for origin, item in fitting:
            label = item_label(origin, item)
            self.combo.addItem(label, str(item.path))
            self.combo.setItemData(self.combo.count() - 1, label, Qt.ItemDataRole.ToolTipRole)
        if current is not None:
            self.set_path(current)

    def path(self) -> Path | None:
        """The chosen file or folder, or None."""
        data = self.combo.currentData()
        return Path(data) if data else None

    def set_path(self, path: Path | None) -> None:
        """Chooses ``path`` (added to the list when it is not there); None chooses none (no LoRA, no model)."""
        if path is None:
            self.combo.setCurrentIndex(0)
            return
        index = self.combo.findData(str(path))
        if index < 0:
            self.combo.addItem(path.name, str(path))
            index = self.combo.count() - 1
        self.combo.setCurrentIndex(index)

    def on_choose_file(self) -> None:
        """Picks a .gguf file."""
        what = "a GGUF LoRA" if self.loras else "a GGUF model"
        path, _ = QFileDialog.getOpenFileName(self, f"Choose {what}", "", "GGUF files (*.gguf)")
        if path:
            self.set_path(Path(path))
            self.sig_picked.emit()

    def on_choose_folder(self) -> None:
        """Picks an MLX model folder."""
        folder = QFileDialog.getExistingDirectory(self, "Choose an MLX model folder")
        if folder:
            self.set_path(Path(folder))
            self.sig_picked.emit()
