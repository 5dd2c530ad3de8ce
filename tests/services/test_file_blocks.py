"""The block readers and writers the transfers hash with."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from desktop.services.platform.files import (
    BLOCK,
    HashingWriter,
    Segment,
    SegmentReader,
    open_hashing_writer,
    sha256_file,
    sha256_prefix,
)


def read_all(reader: SegmentReader) -> tuple[list[tuple[int, bytes]], list[Segment]]:
    blocks, segments = [], []
    while (block := reader.read()) is not None:
        offset, data, segment = block
        blocks.append((offset, data))
        if segment is not None:
            segments.append(segment)
    return blocks, segments


def test_a_segment_reader_hashes_exactly_what_it_reads(tmp_path: Path) -> None:
    data = os.urandom(5 * BLOCK + 12_345)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    with path.open("rb", buffering=0) as handle:
        blocks, segments = read_all(SegmentReader(handle, 1000, len(data), 2 * BLOCK))
    assert b"".join(block for _, block in blocks) == data[1000:]
    assert [offset for offset, _ in blocks] == [1000 + sum(len(b) for _, b in blocks[:i]) for i in range(len(blocks))]
    assert [s.offset for s in segments] == [1000 + sum(s.length for s in segments[:i]) for i in range(len(segments))]
    assert sum(s.length for s in segments) == len(data) - 1000
    assert all(s.sha256 == hashlib.sha256(data[s.offset : s.offset + s.length]).hexdigest() for s in segments)
    assert segments[0].length == 2 * BLOCK and segments[-1].length < BLOCK  # halving towards the end
    for offset, block in blocks:  # no block straddles two segments
        home = next(s for s in segments if s.offset <= offset < s.offset + s.length)
        assert offset + len(block) <= home.offset + home.length


def test_a_segment_reader_refuses_a_file_that_shrank(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(b"x" * 100)
    with path.open("rb", buffering=0) as handle, pytest.raises(OSError, match="got shorter"):
        read_all(SegmentReader(handle, 0, 200, None))


def test_a_hashing_writer_continues_a_partial_file_and_hashes_all_of_it(tmp_path: Path) -> None:
    data = os.urandom(3 * BLOCK)
    path = tmp_path / "copy.part"
    path.write_bytes(data[: BLOCK + 7] + b"stale tail beyond the kept part")
    writer = HashingWriter(path, BLOCK + 7)
    writer.write([data[BLOCK + 7 : 2 * BLOCK], data[2 * BLOCK :]])
    assert writer.close() == hashlib.sha256(data).hexdigest() == sha256_file(path)
    assert path.read_bytes() == data
    assert sha256_prefix(path, 5000) == hashlib.sha256(data[:5000]).hexdigest()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads this process's open files from /proc")
async def test_a_writer_still_opening_when_its_pull_is_cancelled_is_closed(tmp_path: Path) -> None:
    """Stop or quit during a pull: the worker thread opens the file anyway, and it must not stay open."""
    path = tmp_path / "checkpoint.bin.part"
    path.write_bytes(b"x" * (64 << 20))  # continuing a big copy: opening hashes it first (a while, in the thread)

    def open_here() -> int:
        return sum(fd.resolve() == path for fd in Path("/proc/self/fd").iterdir())

    pull = asyncio.ensure_future(open_hashing_writer(path, 64 << 20))
    await asyncio.sleep(0.005)
    pull.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pull
    await asyncio.get_running_loop().shutdown_default_executor()  # the thread has opened and hashed it
    for _ in range(3):
        await asyncio.sleep(0)  # the opening's done callbacks run
    assert open_here() == 0, "the file the cancelled pull was opening is closed"
