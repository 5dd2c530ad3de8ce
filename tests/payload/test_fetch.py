"""The payload's fetch: files from presigned links into the run's folder, each verified by its digest; a wrong digest,
a path outside the folder, a link that fails or a malformed list leave nothing and say why in one JSON line."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trainer_payload.fetch import EXIT_FAILED, EXIT_OK, run_fetch

BODY = b'{"messages": []}\n' * 1000


@pytest.fixture
def served() -> Iterator[tuple[str, list[str]]]:
    """A loopback server answering /data with BODY and anything else 403 (as an expired presigned link)."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            ok = self.path.startswith("/data")
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", str(len(BODY) if ok else 0))
            self.end_headers()
            if ok:
                self.wfile.write(BODY)

        def log_message(self, *_args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def fetch(root: Path, items: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = run_fetch(io.StringIO(json.dumps(items)), root)
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_file_is_fetched_verified_and_kept_on_a_second_fetch(
    served: tuple[str, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, asked = served
    digest = hashlib.sha256(BODY).hexdigest()
    item = {"url": f"{url}/data?X-Amz-Signature=abc", "path": "data/train.jsonl", "sha256": digest, "bytes": len(BODY)}
    code, answer = fetch(tmp_path, [item], capsys)
    assert code == EXIT_OK and answer["files"] == [{"path": "data/train.jsonl", "kept": False, "bytes": len(BODY)}]
    assert (tmp_path / "data" / "train.jsonl").read_bytes() == BODY
    code, answer = fetch(tmp_path, [item], capsys)
    assert code == EXIT_OK and answer["files"] == [{"path": "data/train.jsonl", "kept": True}] and len(asked) == 1


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ({"path": "data/train.jsonl", "sha256": "0" * 64}, "the bucket's copy has sha256"),
        ({"path": "../outside.jsonl"}, "'../outside.jsonl' is not a path inside the run's folder"),
        ({"path": "/etc/x"}, "'/etc/x' is not a path inside the run's folder"),
        ({"url_path": "/expired"}, "cannot download from the bucket: HTTP Error 403"),
        ({"sha256": "not-hex"}, 'the list of files must be [{"url", "path", "sha256", "bytes"}]'),
        ({"url": "file:///etc/passwd"}, 'the list of files must be [{"url", "path", "sha256", "bytes"}]'),
    ],
)
def test_a_fetch_that_cannot_be_trusted_leaves_nothing_and_says_why(
    served: tuple[str, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str], item: dict[str, str], words: str
) -> None:
    url, _asked = served
    digest = hashlib.sha256(BODY).hexdigest()
    given = {"url": f"{url}{item.pop('url_path', '/data')}", "path": "data/train.jsonl", "sha256": digest, **item}
    code, answer = fetch(tmp_path, [given], capsys)
    assert (code == EXIT_FAILED and answer["error"].startswith(words)) or words in answer["error"], answer
    assert not [path for path in tmp_path.rglob("*") if path.is_file()], "nothing left behind, not even a part"
