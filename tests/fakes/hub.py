"""A fake Hugging Face Hub on loopback that serves model folders the way ``snapshot_download`` reads them.

It answers the four requests huggingface_hub makes for a snapshot: the repo info (``/api/models/REPO/revision/REV``),
the file tree (``/api/models/REPO/tree/SHA``), and ``HEAD``/``GET`` of ``/REPO/resolve/SHA/FILE`` with the
``X-Repo-Commit`` and ``ETag`` headers the client checks. A gated repo answers 401 with ``X-Error-Code: GatedRepo``
unless the request carries its token. Every request is recorded, so a test can see what was sent.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    """A served model: its files (from a folder) and, for a gated one, the token it wants."""

    folder: Path
    token: str | None = None
    sha: str = "0123456789abcdef0123456789abcdef01234567"

    def files(self) -> dict[str, Path]:
        """Relative path to file."""
        return {str(p.relative_to(self.folder)): p for p in sorted(self.folder.rglob("*")) if p.is_file()}


@dataclass
class FakeHub:
    """The server and its repos; ``url`` is what ``HF_ENDPOINT`` is set to."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> FakeHub:
        """Serves on a free loopback port until :meth:`stop`."""
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def log_message(self, *_args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stops serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _answer(self, request: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlsplit(request.path).path)
        auth = request.headers.get("authorization")
        self.requests.append((request.command, path, auth))
        status, headers, payload = self._route(path, auth)
        request.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(payload))}.items():
            request.send_header(name, value)
        request.end_headers()
        if body:
            request.wfile.write(payload)

    def _route(self, path: str, auth: str | None) -> tuple[int, dict[str, str], bytes]:
        for repo_id, repo in self.repos.items():
            if f"/{repo_id}/" not in path + "/":
                continue
            if repo.token is not None and auth != f"Bearer {repo.token}":
                return 401, {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"}, b'{"error": "gated"}'
            return self._repo_answer(repo_id, repo, path)
        return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "not found"}, b'{"error": "not found"}'

    def _repo_answer(self, repo_id: str, repo: HubRepo, path: str) -> tuple[int, dict[str, str], bytes]:
        files = repo.files()
        if path.startswith(f"/api/models/{repo_id}/revision/"):
            siblings = [{"rfilename": name} for name in files]
            return 200, _json_type(), json.dumps({"id": repo_id, "sha": repo.sha, "siblings": siblings}).encode()
        if path.startswith(f"/api/models/{repo_id}/tree/"):
            tree = [
                {"type": "file", "path": name, "size": p.stat().st_size, "oid": _oid(p)} for name, p in files.items()
            ]
            return 200, _json_type(), json.dumps(tree).encode()
        name = path.split(f"/{repo_id}/resolve/", 1)[-1].split("/", 1)[-1]
        if name not in files:
            return 404, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "no such file"}, b""
        data = files[name].read_bytes()
        return 200, {"X-Repo-Commit": repo.sha, "ETag": f'"{_oid(files[name])}"'}, data


def _json_type() -> dict[str, str]:
    return {"Content-Type": "application/json"}


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()  # git's blob id scheme, not security
