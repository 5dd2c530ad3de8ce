"""Small file helpers shared by the services.

The block readers and writers here are meant for a worker thread: file reads, writes and hashlib all release the
GIL on blocks of this size, so the event loop runs on while a block is read, written or hashed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (run it in a thread from async code)."""
    return sha256_prefix(path, None)


def sha256_prefix(path: Path, length: int | None) -> str:
    """The SHA-256 of the first ``length`` bytes of a file (all of it when None); run it in a thread."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        _hash_into(digest, handle, length)
    return digest.hexdigest()


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
