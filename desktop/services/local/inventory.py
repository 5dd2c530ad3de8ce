"""What an export folder holds: merged models, GGUF models and LoRAs, MLX folders, Modelfiles and compare reports.

Pure listing: names and sizes from the disk, and a GGUF's kind and type from its header (a few kilobytes); no model
is loaded. Outputs still being written (hidden ``.NAME.partial-*``) and an export's scratch folder (``.work``) are
never listed, so nothing half-written looks finished.

The app writes each adapter's exports to ``exports_root() / NAME`` (NAME: the run id, or the adapter folder's name).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from desktop.services.local.chat import gguf_metadata
from desktop.services.local.common import LocalToolError, folder_bytes
from desktop.services.platform.paths import app_paths

#: The folder a compare report is written to, inside an export folder.
COMPARE_FOLDER = "compare"
#: ``general.file_type`` of a GGUF (llama.cpp's ``LLAMA_FTYPE_MOSTLY_*``) for the types the app writes or meets.
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 15: "Q4_K_M", 17: "Q5_K_M"}
_FILE_TYPES |= {18: "Q6_K", 32: "BF16"}
_TYPE_IN_NAME = re.compile(r"(?i)(?:^|[-_.])(Q\d_K_[SML]|Q\d_K|Q\d_\d|F16|BF16|F32)(?:\.gguf)?$")


class ExportKind(StrEnum):
    """What an exported file or folder is (in the order they are listed)."""

    GGUF = "gguf"
    GGUF_LORA = "gguf_lora"
    MLX = "mlx"
    MERGED = "merged"
    MODELFILE = "modelfile"
    COMPARE_REPORT = "compare_report"


@dataclass(frozen=True)
class ExportedItem:
    """One exported output.

    Attributes:
        kind: What it is.
        path: The file or folder (for a compare report: its HTML page).
        bytes: Its size on disk (a folder's files together).
        qtype: A GGUF's type (``Q4_K_M``), when known.
        of_base: A GGUF of the base model alone (written beside a GGUF LoRA), not of the fine-tuned model.
        damaged: A GGUF whose header cannot be read: it will not load.
    """

    kind: ExportKind
    path: Path
    bytes: int
    qtype: str | None = None
    of_base: bool = False
    damaged: bool = False

    @property
    def chat_engine(self) -> str | None:
        """``llama.cpp`` or ``mlx`` when the chat can load it as a model, else None (LoRAs go beside a model)."""
        if self.kind is ExportKind.GGUF and not self.damaged:
            return "llama.cpp"
        return "mlx" if self.kind is ExportKind.MLX else None

    @property
    def folder(self) -> Path:
        """The folder to show in a file manager: a folder itself, or the one holding the file."""
        if self.kind is ExportKind.COMPARE_REPORT or not self.path.is_dir():
            return self.path.parent
        return self.path


def exports_root() -> Path:
    """Where the app writes exports and compare reports: one folder per adapter (not created here)."""
    return app_paths().data_dir / "exports"


def exports_folder(name: str) -> Path:
    """The export folder of the adapter called ``name`` (a run id, or an adapter folder's name)."""
    return exports_root() / name


def _hidden(path: Path) -> bool:
    return path.name.startswith(".")


def scan_exports(folder: Path) -> list[ExportedItem]:
    """Every finished output in an export folder, by kind (a base's GGUF after the fine-tuned ones), then name.

    An absent folder holds nothing.
    """
    if not folder.is_dir():
        return []
    items = [item for entry in sorted(folder.iterdir()) if not _hidden(entry) for item in _items(entry)]
    order = list(ExportKind)
    return sorted(items, key=lambda item: (order.index(item.kind), item.of_base, item.path.name))


def _items(entry: Path) -> list[ExportedItem]:
    if entry.is_file():
        if entry.suffix.lower() == ".gguf":
            return [_gguf(entry)]
        if entry.name == "Modelfile":
            return [ExportedItem(ExportKind.MODELFILE, entry, entry.stat().st_size)]
        return []
    if entry.name == COMPARE_FOLDER:
        return _report(entry)
    if (entry / "config.json").is_file() and any(entry.glob("*.safetensors")):
        kind = ExportKind.MLX if entry.name == "mlx" else ExportKind.MERGED
        return [ExportedItem(kind, entry, folder_bytes(entry))]
    return []


def _report(folder: Path) -> list[ExportedItem]:
    page = next((folder / name for name in ("report.html", "report.md") if (folder / name).is_file()), None)
    if page is None:
        return []
    return [ExportedItem(ExportKind.COMPARE_REPORT, page, folder_bytes(folder))]


def _gguf(path: Path) -> ExportedItem:
    size = path.stat().st_size
    try:
        found = gguf_metadata(path)
    except (LocalToolError, OSError):
        return ExportedItem(ExportKind.GGUF, path, size, _type_from_name(path), damaged=True)
    kind = ExportKind.GGUF_LORA if found.get("general.type") == "adapter" else ExportKind.GGUF
    file_type = found.get("general.file_type")
    qtype = _type_from_name(path) or (_FILE_TYPES.get(file_type) if isinstance(file_type, int) else None)
    return ExportedItem(kind, path, size, qtype, of_base=path.name.startswith("base-"))


def _type_from_name(path: Path) -> str | None:
    match = _TYPE_IN_NAME.search(path.name)
    return match.group(1).upper() if match else None


def remove_export(item: ExportedItem, root: Path | None = None) -> None:
    """Deletes an exported output (a compare report: its whole folder); refuses anything outside the exports.

    Raises:
        LocalToolError: ``item`` is not inside ``root`` (the exports folder), or could not be removed.
    """
    root = (root or exports_root()).resolve()
    target = item.path.parent if item.kind is ExportKind.COMPARE_REPORT else item.path
    target = target.resolve()
    if root not in target.parents:
        raise LocalToolError(f"{target} is not in Rentune's exports folder ({root}); delete it in your file manager")
    try:
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LocalToolError(f"could not delete {target} ({exc.strerror or exc}); close programs using it") from exc
