"""``python -m trainer_payload push``: uploads a sealed checkpoint's files to the user's bucket, part by part.

The app sends the plan on stdin as JSON, ``{"files": [{"path", "bytes", "parts": [{"number", "offset", "size",
"url"}]}]}``: each part's presigned ``PUT`` URL of a multipart upload the app started (no bucket key on this
machine). Every file must still have the size the plan says (a checkpoint rotated away meanwhile is refused, not sent
half). The last line printed is JSON: each file's part ETags, which the app needs to complete the uploads, or the
first error. Nothing is complete in the bucket until the app completes it: a machine killed here leaves no
checkpoint that looks whole. Stdlib only.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trainer_payload.protocol import UnsafePathError, path_inside

EXIT_OK, EXIT_FAILED = 0, 1
TIMEOUT_SECONDS = 300
_ATTEMPTS = 3
_PLAN_SHAPE = '{"files": [{"path", "bytes", "parts": [{"number", "offset", "size", "url"}]}]}'


class PushError(Exception):
    """A part could not be sent, or the plan does not fit the files here."""


def run_push(stdin: Any = None, root: Path | None = None) -> int:
    """Sends the parts the plan on stdin lists, from files under ``root`` (the run's folder); prints one JSON line."""
    root = (root or Path.cwd()).resolve()
    started = time.monotonic()
    try:
        plan = _read_plan((stdin or sys.stdin).read())
        sent = [{"path": item["path"], "etags": _push_file(root, item)} for item in plan]
    except PushError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return EXIT_FAILED
    print(json.dumps({"files": sent, "seconds": round(time.monotonic() - started, 3)}), flush=True)
    return EXIT_OK


def _push_file(root: Path, item: dict[str, Any]) -> list[str]:
    path = _inside(root, item["path"])
    if not path.is_file() or path.stat().st_size != item["bytes"]:
        raise PushError(f"{item['path']} is not the {item['bytes']:,}-byte file the plan names (rotated away?)")
    etags = []
    with path.open("rb") as data:
        for part in item["parts"]:
            data.seek(part["offset"])
            etags.append(put_part(part["url"], data.read(part["size"]), f"{item['path']} part {part['number']}"))
    return etags


def put_part(url: str, body: bytes, what: str) -> str:
    """PUTs one part (or object) to a presigned URL (three tries: a dropped connection is retried, a refusal is not).

    Returns:
        The ETag the bucket gave it.

    Raises:
        PushError: The bucket refused it, or could not be reached three times.
    """
    for attempt in range(1, _ATTEMPTS + 1):
        request = urllib.request.Request(url, data=body, method="PUT")  # noqa: S310 - http(s) only, checked
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:  # noqa: S310
                etag = answer.headers.get("ETag")
                if not etag:
                    raise PushError(f"{what}: the bucket answered without an ETag")
                return str(etag)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise PushError(f"{what}: the bucket refused it ({exc.code} {exc.reason})") from exc
        except OSError as exc:
            if attempt == _ATTEMPTS:
                raise PushError(f"{what}: cannot reach the bucket ({exc})") from exc
            time.sleep(attempt)
    raise PushError(f"{what}: not sent")  # unreachable: the loop returns or raises


def _read_plan(text: str) -> list[dict[str, Any]]:
    try:
        plan = json.loads(text)
    except ValueError as exc:
        raise PushError(f"the plan is not JSON ({exc})") from exc
    files = plan.get("files") if isinstance(plan, dict) else None
    if not isinstance(files, list) or not all(_valid_file(item) for item in files):
        raise PushError(f"the plan must be {_PLAN_SHAPE}")
    return files


def _valid_file(item: object) -> bool:
    if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not isinstance(item.get("bytes"), int):
        return False
    parts = item.get("parts")
    return isinstance(parts, list) and all(
        isinstance(part, dict)
        and all(isinstance(part.get(key), int) for key in ("number", "offset", "size"))
        and isinstance(part.get("url"), str)
        and part["url"].startswith(("https://", "http://"))
        for part in parts
    )


def _inside(root: Path, relative: str) -> Path:
    try:
        return path_inside(root, relative)
    except UnsafePathError as exc:
        raise PushError(f"{relative!r} is not a path inside the run's folder") from exc
