"""Checkpoints that are safe to resume from: complete only when every file is written and its checksum recorded.

After a kill, a half-written checkpoint has no marker (or files that no longer match it) and is ignored.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

from trainer_payload.protocol import CHECKPOINT_MARKER

_STEP = re.compile(r"^checkpoint-(\d+)$")


def sha256_file(path: Path) -> str:
    """SHA-256 of one file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(4 << 20):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_files(folder: Path) -> list[Path]:
    """Every file of a checkpoint except the marker, in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKPOINT_MARKER)


def seal_checkpoint(folder: Path, step: int) -> dict[str, Any]:
    """Records size and SHA-256 of every file, then writes the marker (atomically) that makes it complete."""
    files = {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in checkpoint_files(folder)
    }
    marker = {"step": step, "files": files}
    tmp = folder / (CHECKPOINT_MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=1), encoding="utf-8")
    tmp.replace(folder / CHECKPOINT_MARKER)
    return marker


def is_complete(folder: Path, *, verify_hashes: bool = True) -> bool:
    """Whether the marker exists and every file it lists is there with its size (and hash)."""
    try:
        marker = json.loads((folder / CHECKPOINT_MARKER).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    for name, info in marker.get("files", {}).items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != info["bytes"]:
            return False
        if verify_hashes and sha256_file(path) != info["sha256"]:
            return False
    return bool(marker.get("files"))


def checkpoints_by_step(root: Path) -> list[tuple[int, Path]]:
    """``checkpoint-N`` folders under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m[1]), p) for p in root.iterdir() if p.is_dir() and (m := _STEP.match(p.name))]
    return sorted(found)


def newest_complete(root: Path) -> Path | None:
    """The newest complete checkpoint; incomplete ones newer than it are deleted (they cannot be resumed)."""
    for _step, folder in reversed(checkpoints_by_step(root)):
        if is_complete(folder):
            return folder
        shutil.rmtree(folder, ignore_errors=True)
    return None
