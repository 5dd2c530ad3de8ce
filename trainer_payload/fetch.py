"""``python -m trainer_payload fetch``: downloads files from presigned URLs into the run's folder, each verified.

The app sends the list on stdin as JSON, ``[{"url", "path", "sha256", "bytes"}]``: the URLs are the bucket's presigned
GET URLs (no bucket key on this machine; each URL reads one object for a few hours), never on the command line. Each
file is written under a temporary name, its SHA-256 compared, then renamed; a file already there with the right
digest is kept (a replacement machine or a retry reads nothing twice). The last line printed is JSON: what was
fetched and kept, or the first error. Stdlib only: it runs before the trainer's packages are installed.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trainer_payload.protocol import UnsafePathError, path_inside

EXIT_OK, EXIT_FAILED = 0, 1
CHUNK_BYTES = 1 << 20
TIMEOUT_SECONDS = 60
_HEX = frozenset("0123456789abcdef")


class FetchError(Exception):
    """A file could not be fetched or did not match its digest."""


def run_fetch(stdin: Any = None, root: Path | None = None) -> int:
    """Fetches the files listed on stdin into ``root`` (the current folder); prints one JSON line; the exit code."""
    root = (root or Path.cwd()).resolve()
    started = time.monotonic()
    try:
        wanted = _read_list((stdin or sys.stdin).read())
        done = [fetch_one(item, root) for item in wanted]
    except FetchError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return EXIT_FAILED
    seconds = round(time.monotonic() - started, 3)
    print(json.dumps({"files": done, "seconds": seconds}), flush=True)
    return EXIT_OK


def fetch_one(item: dict[str, Any], root: Path) -> dict[str, Any]:
    """Downloads one listed file (or keeps the one already there with its digest); says which."""
    target = _inside(root, item["path"])
    if target.is_file() and _digest(target) == item["sha256"]:
        return {"path": item["path"], "kept": True}
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".fetching")
    got = _download(item["url"], partial)
    if got != item["sha256"]:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{item['path']}: the bucket's copy has sha256 {got}, not {item['sha256']}")
    partial.replace(target)
    return {"path": item["path"], "kept": False, "bytes": target.stat().st_size}


def _read_list(text: str) -> list[dict[str, Any]]:
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise FetchError(f"the list of files is not JSON ({exc})") from exc
    if not isinstance(items, list) or not all(_valid(item) for item in items):
        raise FetchError('the list of files must be [{"url", "path", "sha256", "bytes"}]')
    return items


def _valid(item: object) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("url"), str)
        and item["url"].startswith(("https://", "http://"))
        and isinstance(item.get("path"), str)
        and isinstance(item.get("sha256"), str)
        and len(item["sha256"]) == 64
        and set(item["sha256"]) <= _HEX
    )


def _inside(root: Path, relative: str) -> Path:
    try:
        return path_inside(root, relative)
    except UnsafePathError as exc:
        raise FetchError(f"{relative!r} is not a path inside the run's folder") from exc


def _download(url: str, partial: Path) -> str:
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response, partial.open("wb") as out:  # noqa: S310 - http(s) only, checked
            while chunk := response.read(CHUNK_BYTES):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:  # URLError and HTTPError are OSErrors: the bucket refused or could not be reached
        partial.unlink(missing_ok=True)
        if isinstance(exc, urllib.error.HTTPError):
            exc.close()  # it holds the answer's connection open
        raise FetchError(f"cannot download from the bucket: {exc}") from exc
    return digest.hexdigest()


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
