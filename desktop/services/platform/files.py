"""Small file helpers shared by the services: hashing, atomic writes, and reading text saved by Windows tools.

The block readers and writers here are meant for a worker thread: file reads, writes and hashlib all release the
GIL on blocks of this size, so the event loop runs on while a block is read, written or hashed.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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
    return sha256_prefix(path, None)


def sha256_prefix(path: Path, length: int | None) -> str:
    """The SHA-256 of the first ``length`` bytes of a file (all of it when None); run it in a thread."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        _hash_into(digest, handle, length)
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


def _hash_into(digest: hashlib._Hash, handle: BinaryIO, length: int | None) -> None:
    left = length
    while block := handle.read(BLOCK if left is None else min(BLOCK, left)):
        digest.update(block)
        if left is not None:
            left -= len(block)


@dataclass(frozen=True)
class Segment:
    """A byte range of a file and the SHA-256 of those bytes."""

    offset: int
    length: int
    sha256: str


class SegmentReader:
    """Reads a file from ``start`` to ``end`` in blocks, hashing it in segments of ``segment`` bytes as it goes.

    Over the last stretch the segments halve (down to a sixteenth), so the last one, which a caller checking them
    one by one waits for at the end, is small. A block never straddles two segments: the block that ends a segment
    comes with that segment's digest. With ``segment`` None nothing is hashed.
    """

    def __init__(self, handle: BinaryIO, start: int, end: int, segment: int | None) -> None:
        self._handle = handle
        self._offset = start
        self._end = end
        self._segment = segment
        self._digest = hashlib.sha256()
        self._segment_start = start
        self._segment_end = self._next_segment_end()
        handle.seek(start)

    def read(self) -> tuple[int, bytes, Segment | None] | None:
        """The next block as (offset, bytes, the segment it completes or None); None after ``end``.

        Raises:
            OSError: The file ended before ``end`` (it changed while being read).
        """
        if self._offset >= self._end:
            return None
        data = self._handle.read(min(BLOCK, self._segment_end - self._offset))
        if not data:
            raise OSError(f"{getattr(self._handle, 'name', 'the file')} got shorter while it was being sent")
        offset, self._offset = self._offset, self._offset + len(data)
        if self._segment is None:
            return offset, data, None
        self._digest.update(data)
        if self._offset < self._segment_end:
            return offset, data, None
        done = Segment(self._segment_start, self._offset - self._segment_start, self._digest.hexdigest())
        self._digest, self._segment_start = hashlib.sha256(), self._offset
        self._segment_end = self._next_segment_end()
        return offset, data, done

    def _next_segment_end(self) -> int:
        left = self._end - self._segment_start
        if self._segment is None:
            return self._end
        smallest = max(1, self._segment // 16)
        return self._segment_start + (left if left <= smallest else min(self._segment, max(smallest, left // 2)))


class HashingWriter:
    """Writes a file block by block and hashes all of it, continuing after the first ``keep`` bytes already there.

    Creating it hashes the kept part (one read of it), so construct it in a worker thread too.
    """

    def __init__(self, path: Path, keep: int) -> None:
        self._digest = hashlib.sha256()
        self._handle: BinaryIO = path.open("r+b" if keep else "wb")
        try:
            if keep:
                _hash_into(self._digest, self._handle, keep)
                self._handle.seek(keep)
                self._handle.truncate()
        except BaseException:
            self._handle.close()
            raise

    def write(self, blocks: list[bytes]) -> None:
        """Appends the blocks and hashes them."""
        for block in blocks:
            self._handle.write(block)
            self._digest.update(block)

    def close(self) -> str:
        """Closes the file and returns the SHA-256 of everything in it."""
        self._handle.close()
        return self._digest.hexdigest()


async def open_hashing_writer(path: Path, keep: int) -> HashingWriter:
    """A :class:`HashingWriter` made in a worker thread; closed again if the caller is cancelled meanwhile.

    A thread cannot be stopped: it opens the file even after the task awaiting it was cancelled (Stop, the app
    closing mid-pull), and the handle would be left open.
    """
    opening = asyncio.ensure_future(asyncio.to_thread(HashingWriter, path, keep))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_if_opened)
        raise


def _close_if_opened(opening: asyncio.Future[HashingWriter]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
