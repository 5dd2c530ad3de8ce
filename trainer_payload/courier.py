"""``python -m trainer_payload courier``: sends each sealed checkpoint to the user's bucket by itself, app or not.

The app hands the machine links ahead (``out/courier/mandate.json``), made from a checkpoint it has seen: for each of
the run's next planned checkpoints, each file's multipart upload (presigned part URLs and the presigned completion)
and the seal's presigned ``PUT``. No bucket key is on the machine: each link writes one object under the run's prefix
until it expires, and the app renews them while it follows the run. The courier watches ``out/checkpoints``; once
the newest checkpoint is sealed and the links cover it, it stages its files (hard links, so the trainer's rotation
cannot take them away mid-send), sends every part, completes each file, and writes the seal last. A checkpoint whose
seal is in the bucket is therefore whole, and a machine killed mid-send leaves none that looks whole.

A line in ``out/courier/receipts.jsonl`` says what became of each checkpoint it tried; ``out/courier/BUSY`` is
touched while it sends (the self-stop waits while it is fresh). It ends once the trainer has ended and nothing is
left to send, or when its links have expired.

Started as ``python -m trainer_payload courier --detach PIDFILE`` in the run's folder. Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from trainer_payload.protocol import (
    CHECKPOINT_MARKER,
    COURIER_BUSY_NAME,
    COURIER_DIR_NAME,
    MANDATE_FILE_NAME,
    RECEIPTS_FILE_NAME,
    TRAINER_EXIT_FILE_NAME,
    UnsafePathError,
    check_relative_path,
)
from trainer_payload.push import TIMEOUT_SECONDS, PushError, put_part

#: The size parts are cut to when the links allow it; larger parts when a file grew past its links' count.
PART_BYTES = 64 << 20
#: S3's largest part.
MAX_PART_BYTES = 5 << 30
POLL_SECONDS = 2.0
_STEP = re.compile(r"checkpoint-(\d+)")
_MANDATE_SHAPE = '{"expires": SECONDS, "checkpoints": {"checkpoint-N": {"seal": URL, "files": {NAME: {"parts": [URL], "complete": URL}}}}}'  # noqa: E501


class CourierError(Exception):
    """A checkpoint cannot be sent with the links at hand, or the bucket refused it."""


@dataclass(frozen=True)
class FileLinks:
    """One file's multipart upload: a presigned URL per part it may use, and the presigned completion."""

    parts: list[str]
    complete: str


@dataclass(frozen=True)
class CheckpointLinks:
    """One planned checkpoint's links: each file's upload, and the seal's ``PUT`` (written last)."""

    files: dict[str, FileLinks]
    seal: str


@dataclass(frozen=True)
class Mandate:
    """The links the app handed out ahead: until when they work, and for which checkpoints (by folder name)."""

    expires: float
    checkpoints: dict[str, CheckpointLinks]

    @classmethod
    def parse(cls, text: str) -> Mandate:
        """Reads the app's ``mandate.json``.

        Raises:
            CourierError: It is not JSON of the documented shape, or a link is not http(s).
        """
        try:
            data = json.loads(text)
            checkpoints = {
                _checked_name(name): CheckpointLinks(
                    files={check(f): _file_links(links) for f, links in entry["files"].items()},
                    seal=_url(entry["seal"]),
                )
                for name, entry in data["checkpoints"].items()
            }
            return cls(float(data["expires"]), checkpoints)
        except (ValueError, KeyError, TypeError, AttributeError, UnsafePathError) as exc:
            raise CourierError(f"the links are not {_MANDATE_SHAPE} ({exc})") from exc


def check(name: str) -> str:
    """A file name of a checkpoint, checked to stay inside its folder."""
    return check_relative_path(name)


def _checked_name(name: str) -> str:
    if not _STEP.fullmatch(name):
        raise ValueError(f"{name!r} is not a checkpoint-N folder")
    return name


def _file_links(links: dict[str, Any]) -> FileLinks:
    parts = [_url(url) for url in links["parts"]]
    if not parts:
        raise ValueError("a file has no part links")
    return FileLinks(parts, _url(links["complete"]))


def _url(value: object) -> str:
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        raise ValueError(f"{str(value)[:60]!r} is not an http(s) link")
    return value


def part_sizes(size: int, available: int) -> list[int]:
    """How a file of ``size`` bytes is cut into at most ``available`` parts (64 MiB each when they suffice).

    Raises:
        CourierError: It would need parts larger than S3 takes (5 GiB).
    """
    wanted = max(PART_BYTES, -(-size // available))
    part = -(-wanted // (1 << 20)) << 20  # whole MiB
    if part > MAX_PART_BYTES:
        raise CourierError(f"a {size:,}-byte file needs more than its {available} part links")
    count = max(1, -(-size // part))
    return [min(part, size - index * part) for index in range(count)]


def sealed_files(seal: bytes) -> dict[str, int]:
    """The files a checkpoint's seal lists, with their sizes (names checked to stay inside the checkpoint).

    Raises:
        CourierError: The seal is not the payload's.
    """
    try:
        files = json.loads(seal)["files"]
        sizes = {check(name): int(info["bytes"]) for name, info in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError, UnsafePathError) as exc:
        raise CourierError(f"the checkpoint's seal cannot be read ({exc})") from exc
    if not sizes:
        raise CourierError("the checkpoint's seal lists no files")
    return sizes


def stage(folder: Path, sizes: dict[str, int], staging: Path) -> None:
    """Hard-links the checkpoint's files into ``staging``, each checked against the seal's size.

    Raises:
        CourierError: A file is gone (rotated away) or is not the size the seal says.
    """
    shutil.rmtree(staging, ignore_errors=True)
    for name, size in sizes.items():
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / name, target)
        except OSError as exc:
            raise CourierError(f"{folder.name}/{name} went before it was sent ({exc.strerror})") from exc
        if target.stat().st_size != size:
            raise CourierError(f"{folder.name}/{name} is not the {size:,} bytes its seal says")


def send_file(path: Path, links: FileLinks, touch: Callable[[], None]) -> None:
    """Sends one file part by part through its links, then completes its upload.

    Raises:
        CourierError: The file needs more parts than its links, or the bucket refused a part or the completion.
        PushError: A part could not be sent.
    """
    sizes = part_sizes(path.stat().st_size, len(links.parts))
    etags = []
    with path.open("rb") as data:
        for number, (url, size) in enumerate(zip(links.parts, sizes, strict=False), start=1):
            touch()
            etags.append(put_part(url, data.read(size), f"{path.name} part {number}"))
    complete(links.complete, etags, path.name)


def complete(url: str, etags: list[str], what: str) -> None:
    """Completes a multipart upload with its parts' ETags (a presigned ``POST``).

    Raises:
        CourierError: The bucket refused it (S3 may say so in the body of a 200 answer, too).
    """
    parts = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{escape(tag)}</ETag></Part>" for n, tag in enumerate(
        etags, start=1))  # fmt: skip
    body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/xml"})  # noqa: S310 - http(s) only, checked
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:  # noqa: S310
            said = answer.read(1 << 16)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise CourierError(f"{what}: the bucket refused to complete it ({exc.code} {exc.reason})") from exc
    except OSError as exc:
        raise CourierError(f"{what}: cannot reach the bucket to complete it ({exc})") from exc
    if b"<Error>" in said:
        raise CourierError(f"{what}: the bucket refused to complete it ({said[:200].decode(errors='replace')})")


class Courier:
    """Watches a run's ``out`` folder and sends each newest sealed checkpoint its links cover, once.

    Args:
        out: The run's output folder (``out``).
        now: The clock (seconds since the epoch), injectable for tests.
    """

    def __init__(self, out: Path, now: Callable[[], float] = time.time) -> None:
        self.out = out.resolve()
        self.folder = self.out / COURIER_DIR_NAME
        self.now = now
        self.started = now()
        self.tried = {str(line.get("name")) for line in read_receipts(self.folder / RECEIPTS_FILE_NAME)}

    def sweep(self) -> dict[str, Any] | None:
        """Sends the newest sealed checkpoint when the links cover it and it was not tried yet; its receipt, or None."""
        due = self._due()
        if due is None:
            return None
        folder, mandate = due
        self.tried.add(folder.name)
        receipt = self._send(folder, mandate)
        append_receipt(self.folder / RECEIPTS_FILE_NAME, receipt)
        return receipt

    def finished(self) -> bool:
        """Whether there is nothing more to wait for.

        That is: the links expired, or the trainer ended (after this courier started) and nothing is left to send.
        """
        mandate = self._mandate()
        if mandate is not None and mandate.expires < self.now():
            return True
        try:
            ended = (self.out / TRAINER_EXIT_FILE_NAME).stat().st_mtime >= self.started - 1
        except OSError:
            return False
        return ended and self._due() is None

    def run(self, poll_seconds: float = POLL_SECONDS) -> int:
        """Sweeps until :meth:`finished`; returns 0."""
        while True:
            self.sweep()
            if self.finished():
                _log("courier done: nothing is left to send")
                return 0
            time.sleep(poll_seconds)

    def _due(self) -> tuple[Path, Mandate] | None:
        newest = self._newest_sealed()
        if newest is None or newest.name in self.tried:
            return None
        mandate = self._mandate()
        if mandate is None or newest.name not in mandate.checkpoints:
            return None
        return newest, mandate

    def _newest_sealed(self) -> Path | None:
        root = self.out / "checkpoints"
        found = sorted(
            (int(match[1]), path)
            for path in (root.iterdir() if root.is_dir() else [])
            if (match := _STEP.fullmatch(path.name)) and (path / CHECKPOINT_MARKER).is_file()
        )
        return found[-1][1] if found else None

    def _mandate(self) -> Mandate | None:
        try:
            return Mandate.parse((self.folder / MANDATE_FILE_NAME).read_text(encoding="utf-8"))
        except OSError:
            return None
        except CourierError as exc:
            _log(str(exc))
            return None

    def _send(self, folder: Path, mandate: Mandate) -> dict[str, Any]:
        started = self.now()
        receipt: dict[str, Any] = {"name": folder.name, "step": int(folder.name.split("-")[1])}
        staging = self.folder / "staging" / folder.name
        busy = self.folder / COURIER_BUSY_NAME
        try:
            if mandate.expires < started:
                raise CourierError("the links expired (the app renews them while it follows the run)")
            sent = send_checkpoint(folder, mandate.checkpoints[folder.name], staging, busy.touch)
        except (CourierError, PushError, OSError) as exc:
            _log(f"{folder.name} was not sent: {exc}")
            return {**receipt, "ok": False, "error": str(exc)[:500]}
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            busy.unlink(missing_ok=True)
        _log(f"{folder.name} is in the bucket ({sent:,} bytes)")
        return {**receipt, "ok": True, "bytes": sent, "seconds": round(self.now() - started, 3)}


def send_checkpoint(folder: Path, links: CheckpointLinks, staging: Path, touch: Callable[[], None]) -> int:
    """Sends a sealed checkpoint: every file, then its seal; returns the bytes sent.

    Raises:
        CourierError: The links do not cover its files, a file went, or the bucket refused.
        PushError: A part could not be sent.
    """
    touch()
    seal = (folder / CHECKPOINT_MARKER).read_bytes()
    sizes = sealed_files(seal)
    uncovered = sorted(set(sizes) - set(links.files))
    if uncovered:
        raise CourierError(f"the links do not cover {', '.join(uncovered[:3])} (the app sends it when it follows)")
    stage(folder, sizes, staging)
    for name in sorted(sizes):
        send_file(staging / name, links.files[name], touch)
    put_part(links.seal, seal, f"{folder.name}'s seal")
    return sum(sizes.values()) + len(seal)


def read_receipts(path: Path) -> list[dict[str, Any]]:
    """The receipts written so far (lines that are not JSON objects are skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    parsed = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            parsed.append(item)
    return parsed


def append_receipt(path: Path, receipt: dict[str, Any]) -> None:
    """Appends one receipt as a line (one write, then fsync)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        handle.write((json.dumps({"ts": round(time.time(), 3), **receipt}) + "\n").encode())
        handle.flush()
        os.fsync(handle.fileno())


def _log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {line}", flush=True)


def main(args: list[str]) -> int:
    """``[--detach PIDFILE]``: watches ``out`` in the current folder (detached on request)."""
    from trainer_payload.self_stop import detach

    if args and (len(args) != 2 or args[0] != "--detach"):
        print("usage: python -m trainer_payload courier [--detach PIDFILE]", file=sys.stderr)
        return 2
    if args:
        started = detach(Path(args[1]))
        if started is not None:
            return started
    return Courier(Path("out")).run()
