"""Small file helpers shared by the services: hashing, atomic writes, and reading text saved by Windows tools."""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

BLOCK = 1 << 20
# PowerShell's `>` and Notepad write these marks at the start of a text file.
_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (run it in a thread from async code)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def bom_encoding(head: bytes) -> str:
    """The text encoding announced by a file's first bytes: ``utf-8-sig``, ``utf-16``, or ``utf-8`` without a mark.

    ``utf-8-sig`` and ``utf-16`` drop the mark when decoding, so the first line reads like any other.
    """
    return next((name for mark, name in _BOMS if head.startswith(mark)), "utf-8")


def file_encoding(path: Path) -> str:
    """:func:`bom_encoding` of the file at ``path`` (reads its first 4 bytes)."""
    with path.open("rb") as handle:
        return bom_encoding(handle.read(4))


def read_text(path: Path) -> str:
    """A text file's content, as UTF-8 or, when its first bytes say so, UTF-8 with a BOM or UTF-16.

    Raises:
        OSError: The file cannot be read.
        UnicodeDecodeError: The file is not valid text in that encoding.
    """
    data = path.read_bytes()
    return data.decode(bom_encoding(data[:4]))


def _fsync_folder(folder: Path) -> None:
    """Makes a rename in ``folder`` durable (POSIX; Windows cannot open a folder for fsync and needs no such step)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """Opens a temporary file beside ``path``; on a clean exit it is flushed to disk and renamed onto ``path``.

    Readers see the old file or the whole new one, never a part. On an error the temporary file is removed and
    ``path`` is left as it was.
    """
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    partial = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Writes ``data`` to ``path`` atomically (see :func:`atomic_writer`); returns ``path``."""
    with atomic_writer(path) as handle:
        handle.write(data)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Writes ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_writer`); returns ``path``."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_copy(source: Path, target: Path) -> Path:
    """Copies a small file onto ``target`` atomically (see :func:`atomic_writer`); returns ``target``."""
    return atomic_write_bytes(target, source.read_bytes())


def commit_file_set(folder: Path, files: Mapping[str, Path | None], marker: Path) -> None:
    """Moves staged files into ``folder`` as one set that the ``marker`` file (a manifest) vouches for.

    The old marker is removed first and the new one moved in last, so a crash in between leaves a folder without a
    marker (unfinished) rather than new files beside an old marker.

    Args:
        folder: Where the set lives.
        files: Name in ``folder`` → the staged file to move there (same file system), or None to remove that name
            (a file the new set no longer has, such as an old eval split).
        marker: The staged marker file; it keeps its name in ``folder``.
    """
    (folder / marker.name).unlink(missing_ok=True)
    _fsync_folder(folder)
    for name, staged in files.items():
        if staged is None:
            (folder / name).unlink(missing_ok=True)
        else:
            staged.replace(folder / name)
    marker.replace(folder / marker.name)
    _fsync_folder(folder)
