"""A fake Weights & Biases server on loopback, answering what the real ``wandb`` client sends for a run.

Checked with wandb 0.31.0, whose Go ``wandb-core`` service does the networking. It answers ``POST /graphql``
for the operations a run's ``init``/``log``/``finish`` send (``Viewer``, ``ServerFeaturesQuery``,
``RunResumeStatus``, ``UpsertBucket``, ``OrganizationCoreWeaveOrganizationID``, ``CreateRunFiles``,
``MarkRunFilesUploaded``; any other operation gets
``{"data": {}}`` and is recorded in ``unknown_operations``), the file stream
(``POST /files/ENTITY/PROJECT/RUN/file_stream``: history, summary, console lines, ``complete``/``exitcode``) and
the ``PUT`` of each run file to the upload URL it handed out. Every other request must carry HTTP Basic auth
``api:KEY`` with the expected key, else it answers 401 like W&B; uploads (signed storage URLs at W&B) carry none,
and the SDK's analytics probe (``POST /sdk/otel/...``, sent without the key) gets 404, as from a server without
that proxy, which turns the SDK's telemetry off. Every request is recorded.
"""

from __future__ import annotations

import base64
import gzip
import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

#: A key of the shape wandb accepts (40+ word characters), used unless a test names another.
TEST_API_KEY = "local" + "-" + "0123456789abcdef" * 3


@dataclass
class FakeRun:
    """A run as the server saw it: names, config, the history rows streamed, the files uploaded, how it ended."""

    run_id: str
    project: str
    entity: str
    display_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    console: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    complete: bool = False
    exit_code: int | None = None


@dataclass
class FakeWandb:
    """The server; ``url`` is what ``WANDB_BASE_URL`` is set to, ``api_key`` the only key it accepts."""

    api_key: str = TEST_API_KEY
    entity: str = "ada"
    runs: dict[str, FakeRun] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)
    unknown_operations: list[str] = field(default_factory=list)
    auth_failures: int = 0
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> FakeWandb:
        """Serves on a free loopback port until :meth:`stop`."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake._handle(self)

            def do_POST(self) -> None:
                fake._handle(self)

            def do_PUT(self) -> None:
                fake._handle(self)

            def log_message(self, *_args: Any) -> None:
                return

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stops serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        path = unquote(urlsplit(request.path).path)
        auth = request.headers.get("authorization")
        body = _read_body(request)
        payload: Any
        with self._lock:
            self.requests.append((request.command, path, auth))
            if path.startswith("/sdk/otel/"):
                status, payload = 404, {"error": "not found"}
            elif not path.startswith("/upload/") and auth != _basic(self.api_key):
                self.auth_failures += 1
                status, payload = 401, {"errors": [{"message": "user is not logged in"}]}
            else:
                status, payload = self._route(request.command, path, body)
        data = json.dumps(payload).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if method == "POST" and path == "/graphql":
            query = json.loads(body)
            return 200, self._graphql(query.get("operationName") or "", query.get("variables") or {})
        if method == "POST" and len(parts) == 5 and parts[0] == "files" and parts[4] == "file_stream":
            return 200, self._file_stream(parts[3], json.loads(body))
        if method == "PUT" and len(parts) >= 5 and parts[0] == "upload" and parts[3] in self.runs:
            self.runs[parts[3]].files["/".join(parts[4:])] = body
            return 200, {}
        return 404, {"errors": [{"message": f"no route for {method} {path}"}]}

    def _graphql(self, operation: str, variables: dict[str, Any]) -> dict[str, Any]:
        self.operations.append(operation)
        if operation == "Viewer":
            viewer = {"id": "VXNlcjox", "entity": self.entity, "username": self.entity, "email": "ada@example.com"}
            return {"data": {"viewer": {**viewer, "flags": "{}", "teams": {"edges": []}}}}
        if operation == "ServerFeaturesQuery":
            return {"data": {"serverInfo": {"features": []}}}
        if operation == "RunResumeStatus":
            entity = {"id": "RW50aXR5OjE=", "name": variables.get("entity") or self.entity}
            project = {"id": "UHJvamVjdDox", "name": variables.get("project"), "entity": entity}
            return {"data": {"model": {**project, "bucket": None}}}
        if operation == "UpsertBucket":
            return {"data": {"upsertBucket": self._upsert(variables)}}
        if operation == "OrganizationCoreWeaveOrganizationID":
            return {"data": {"entity": {"organization": None}}}
        if operation == "CreateRunFiles":
            run = variables["run"]
            base = f"{self.url}/upload/{variables['entity']}/{variables['project']}/{run}"
            files = [{"name": name, "uploadUrl": f"{base}/{name}"} for name in variables["files"]]
            return {"data": {"createRunFiles": {"runID": _run_gid(run), "uploadHeaders": [], "files": files}}}
        if operation == "MarkRunFilesUploaded":
            return {"data": {"markRunFilesUploaded": {"success": True}}}
        self.unknown_operations.append(operation)
        return {"data": {}}

    def _upsert(self, variables: dict[str, Any]) -> dict[str, Any]:
        run_id = variables.get("name") or f"run{len(self.runs)}"
        project = variables.get("project") or "uncategorized"
        entity = variables.get("entity") or self.entity
        inserted = run_id not in self.runs
        run = self.runs.setdefault(run_id, FakeRun(run_id=run_id, project=project, entity=entity))
        if variables.get("displayName"):
            run.display_name = variables["displayName"]
        if variables.get("config"):
            raw = json.loads(variables["config"])
            run.config.update({k: v.get("value") for k, v in raw.items() if k != "_wandb" and isinstance(v, dict)})
        bucket = {
            "id": _run_gid(run_id),
            "name": run_id,
            "displayName": run.display_name,
            "description": variables.get("description"),
            "config": json.dumps({k: {"value": v} for k, v in run.config.items()}),
            "sweepName": None,
            "project": {"id": "UHJvamVjdDox", "name": project, "entity": {"id": "RW50aXR5OjE=", "name": entity}},
            "historyLineCount": len(run.history),
        }
        return {"bucket": bucket, "inserted": inserted}

    def _file_stream(self, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        run = self.runs.get(run_id)
        if run is None:
            return {"error": "no such run"}
        files = body.get("files") or {}
        run.history += [json.loads(line) for line in files.get("wandb-history.jsonl", {}).get("content", [])]
        for line in files.get("wandb-summary.json", {}).get("content", []):
            run.summary = json.loads(line)
        run.console += files.get("output.log", {}).get("content", [])
        if body.get("complete"):
            run.complete = True
            run.exit_code = body.get("exitcode")
        return {"exitcode": None, "limits": {}}


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client dropping a kept-alive connection
            super().handle_error(request, client_address)


def _read_body(request: BaseHTTPRequestHandler) -> bytes:
    if request.headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int(request.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(request.rfile.read(size))
            request.rfile.readline()
        request.rfile.readline()
        body = b"".join(chunks)
    else:
        body = request.rfile.read(int(request.headers.get("content-length") or 0))
    return gzip.decompress(body) if request.headers.get("content-encoding") == "gzip" else body


def _basic(key: str) -> str:
    return "Basic " + base64.b64encode(f"api:{key}".encode()).decode()


def _run_gid(run_id: str) -> str:
    return base64.b64encode(f"Run:v1:{run_id}".encode()).decode()
