"""Small file helpers shared by the services."""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (run it in a thread from async code)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()
