"""What every local model tool shares: errors, progress, whole-or-nothing outputs, disk space, child processes.

One error type with a one-line message; progress reports; outputs that appear whole or not at all; a disk-space
check; heavy work run in a child Python that can be cancelled.

Heavy libraries (torch, transformers, peft, llama_cpp, mlx) are never imported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from desktop.services.platform.secrets import without_secrets

#: Called with a step's words and how far it is (0..1), or None when that is unknown.
Progress = Callable[[str, float | None], None]


class LocalToolError(Exception):
    """A local step could not be done; the message names the problem and the fix, in one line."""


class LocalInputError(LocalToolError):
    """The input cannot be used (a damaged file, an adapter for another base): the user must change it."""


def no_progress(_text: str, _fraction: float | None) -> None:
    """A :data:`Progress` that ignores reports."""


def partial_name(target: Path) -> Path:
    """The temporary name ``target`` is written under until it is complete (hidden, beside it)."""
    return target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def finished_folder(target: Path) -> Iterator[Path]:
    """Yields a temporary folder beside ``target``; renamed to ``target`` only if the block succeeds.

    An existing ``target`` is replaced at the end, never before, so a failed export keeps the last good one; a
    failure removes the temporary folder, so nothing half-written looks finished.
    """
    work = partial_name(target)
    work.mkdir(parents=True)
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    _replace(work, target)


@contextlib.contextmanager
def finished_file(target: Path) -> Iterator[Path]:
    """Yields a temporary path beside ``target``; renamed to ``target`` only if the block succeeds."""
    work = partial_name(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    except BaseException:
        work.unlink(missing_ok=True)
        raise
    if not work.is_file():
        raise LocalToolError(f"{target.name} was not written; see the log for the step's output")
    work.replace(target)


def _replace(work: Path, target: Path) -> None:
    if target.exists():
        old = partial_name(target)
        target.rename(old)
        work.rename(target)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    else:
        work.rename(target)


def folder_bytes(path: Path) -> int:
    """The bytes of every file under ``path`` (a file's own size for a file).

    Links count as themselves, not what they point to (a venv's ``bin/python``); a file removed while it is being
    added up (a folder being deleted) counts as nothing.
    """
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
    return total


def require_free_space(folder: Path, needed: int, what: str) -> None:
    """Raises :class:`LocalToolError` unless ``folder``'s disk has ``needed`` bytes free (plus 5 % headroom).

    Args:
        folder: Where the output goes (the nearest existing parent is measured).
        needed: Bytes the step will write.
        what: The output, for the message ("the merged model").
    """
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed * 1.05:
        raise LocalToolError(
            f"not enough disk space for {what}: it needs {needed / 1e9:.2f} GB, {probe} has {free / 1e9:.2f} GB "
            "free; free some space or choose another --out"
        )


async def run_program(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    what: str,
) -> str:
    """Runs ``command`` in a child process and returns its output.

    The child gets ``env`` (this process's environment by default) without any secret variable (see
    :func:`~desktop.services.platform.secrets.without_secrets`): no local tool needs an API key or a token.
    Output lines (stdout and stderr together) go to ``on_line`` as they come. Cancelling the awaiting task kills
    the child, so a cancelled step stops using the CPU at once.

    Raises:
        LocalToolError: It could not start, or exited non-zero; the message has ``what`` and the output's last lines.
    """
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=without_secrets(env),
        )
    except OSError as exc:
        raise LocalToolError(f"{what} could not start {command[0]} ({exc.strerror or exc})") from exc
    try:
        lines = await _read_lines(process, on_line)
        code = await process.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    output = "".join(lines)
    if code != 0:
        tail = " | ".join(line.strip() for line in lines[-6:] if line.strip())[-1200:]
        raise LocalToolError(f"{what} failed (exit {code}): {tail or 'no output'}")
    return output


async def _read_lines(process: asyncio.subprocess.Process, on_line: Callable[[str], None] | None) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    async for raw in process.stdout:
        line = raw.decode("utf-8", errors="replace")
        lines.append(line)
        if on_line is not None:
            on_line(line.rstrip("\n"))
    return lines
