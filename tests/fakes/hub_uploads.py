"""A stand-in for the Hugging Face Hub's write API on loopback, answering what ``huggingface_hub`` sends to publish.

Built from the requests huggingface_hub 2.x makes for ``create_repo`` and ``create_commit`` over the Git LFS
protocol (hf_xet's own storage protocol is not stood in: the publisher turns it off): ``POST /api/repos/create``,
``POST /api/validate-yaml`` (a README's metadata),
``POST /api/models/REPO/preupload/REV`` (which files go to LFS), ``POST /REPO.git/info/lfs/objects/batch``, the
``PUT`` of each large file to the URL the batch gave, and ``POST /api/models/REPO/commit/REV`` (NDJSON: a header,
small files inline in base64, large files by sha256). Every write needs the account's token; a large file's bytes
must hash to the oid the commit names. Every request is recorded; from upload number ``broken_from_put`` on,
uploads fail (503).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

#: Files at least this large go through LFS (the Hub's own threshold is 10 MB; smaller here so tests send some).
LFS_FROM_BYTES = 100_000


@dataclass
class PublishedRepo:
    """A repo created at the stand-in: its visibility, committed files and commit messages."""

    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)


@dataclass
class HubUploads:
    """The server; ``url`` is what ``HF_ENDPOINT`` is set to, ``token`` the account's only valid token."""

    token: str = "hf_publisher_token_for_tests"
    user: str = "ada"
    repos: dict[str, PublishedRepo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    broken_from_put: int | None = None
    puts: int = 0
    url: str = ""
    _lfs: dict[str, bytes] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> HubUploads:
        """Serves on a free loopback port until :meth:`stop`."""
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                hub._handle(self)

            def do_POST(self) -> None:
                hub._handle(self)

            def do_PUT(self) -> None:
                hub._handle(self)

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

    # -- dispatch ----------------------------------------------------------------------------------------------------

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(request.path)
        path = unquote(parts.path)
        length = int(request.headers.get("content-length") or 0)
        body = request.rfile.read(length) if length else b""
        self.requests.append((request.command, path))
        # a storage URL is signed, like a pre-signed S3 URL: it carries no token, the batch's signature instead
        signed = path.startswith("/lfs-upload/") and parts.query == f"signature={_signature(self.token, path)}"
        if not signed and request.headers.get("authorization") != f"Bearer {self.token}":
            status, payload = 401, {"error": "Invalid credentials in Authorization header"}
        else:
            status, payload = self._route(request.command, path, body)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        if status >= 400:
            request.send_header("X-Error-Message", str(payload.get("error")) if isinstance(payload, dict) else "error")
        request.end_headers()
        request.wfile.write(data)

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if method == "GET" and path == "/api/whoami-v2":
            return 200, {"type": "user", "name": self.user, "auth": {"accessToken": {"role": "write"}}}
        if method == "POST" and path == "/api/validate-yaml":  # a README.md's metadata, checked before the commit
            return self._validate_yaml(json.loads(body))
        if method == "POST" and path == "/api/repos/create":
            return self._create(json.loads(body))
        if method == "POST" and path.endswith(".git/info/lfs/objects/batch"):
            return self._batch(json.loads(body))
        if method == "PUT" and path.startswith("/lfs-upload/"):
            return self._put(path.rsplit("/", 1)[-1], body)
        if method == "POST" and path.startswith("/api/models/") and "/preupload/" in path:
            return self._preupload(json.loads(body))
        if method == "POST" and path.startswith("/api/models/") and "/commit/" in path:
            return self._commit(path.split("/api/models/", 1)[1].split("/commit/", 1)[0], body)
        return 404, {"error": f"{method} {path} is not part of the stand-in"}

    # -- the calls ---------------------------------------------------------------------------------------------------

    def _create(self, request: dict[str, Any]) -> tuple[int, Any]:
        repo_id = f"{request.get('organization') or self.user}/{request['name']}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
        private = request.get("private") is True or request.get("visibility") == "private"
        self.repos[repo_id] = PublishedRepo(private)
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id, "id": repo_id}

    def _validate_yaml(self, request: dict[str, Any]) -> tuple[int, Any]:
        content = str(request.get("content", ""))
        if not content.startswith("---\n") or "\n---\n" not in content[4:]:
            return 400, {"error": "the model card's metadata is not a --- block at the top"}
        return 200, {"errors": [], "warnings": []}

    def _preupload(self, request: dict[str, Any]) -> tuple[int, Any]:
        files = [
            {
                "path": f["path"],
                "uploadMode": "lfs" if f["size"] >= LFS_FROM_BYTES else "regular",
                "shouldIgnore": False,
            }
            for f in request["files"]
        ]
        return 200, {"files": files, "commitOid": "0" * 40}

    def _batch(self, request: dict[str, Any]) -> tuple[int, Any]:
        objects = []
        for item in request["objects"]:
            entry: dict[str, Any] = {"oid": item["oid"], "size": item["size"]}
            if item["oid"] not in self._lfs:  # already stored: no action, nothing is sent again
                where = f"/lfs-upload/{item['oid']}"
                href = f"{self.url}{where}?signature={_signature(self.token, where)}"
                entry["actions"] = {"upload": {"href": href, "header": {}}}
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}

    def _put(self, oid: str, body: bytes) -> tuple[int, Any]:
        self.puts += 1
        if self.broken_from_put is not None and self.puts >= self.broken_from_put:  # the storage is down from then
            return 503, {"error": "the storage is busy"}
        if hashlib.sha256(body).hexdigest() != oid:
            return 400, {"error": "the bytes do not hash to the oid"}
        self._lfs[oid] = body
        return 200, b""

    def _commit(self, repo_id: str, body: bytes) -> tuple[int, Any]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return 404, {"error": f"Repository {repo_id} not found"}
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        added: dict[str, bytes] = {}
        for line in lines:
            value = line["value"]
            if line["key"] == "file":
                added[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                if value["oid"] not in self._lfs:
                    return 422, {"error": f"{value['path']}: its LFS object was never uploaded"}
                added[value["path"]] = self._lfs[value["oid"]]
        repo.files.update(added)
        repo.commits.append(next(line["value"]["summary"] for line in lines if line["key"] == "header"))
        oid = hashlib.sha1(body).hexdigest()
        return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}


def _signature(token: str, path: str) -> str:
    return hashlib.sha256(f"{token}:{path}".encode()).hexdigest()[:32]
