"""The machine's self-stop: when it is due, what it sends to each provider, that the fakes obey it, and that the key
it may carry lives in its memory only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from desktop.services.machines.ssh import Endpoint, RemoteMachine
from desktop.services.providers.base import OfferQuery, ProviderName, RentRequest
from desktop.services.providers.registry import open_provider
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.runs.self_stop import PID_FILE, arm_command
from tests.fakes.http import FakeCloud
from tests.fakes.runpod import FakeRunPod
from tests.fixtures.sshd import SshHost
from trainer_payload.protocol import (
    COURIER_BUSY_NAME,
    COURIER_BUSY_SECONDS,
    COURIER_DIR_NAME,
    HEARTBEAT_NAME,
    STOP_MARKER_NAME,
)
from trainer_payload.self_stop import (
    RUNPOD_V2_URL,
    ProviderRefusedError,
    SelfStopConfig,
    SelfStopError,
    due,
    machine_variable,
    send,
    terminate,
    terminate_requests,
)

KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf2lCXjVHZmIeOaVG7CXHPBBpU1KLdmkLmNbdzN8YKc x"
PAYLOAD_ROOT = Path(__file__).parents[2]
LAMBDA_KEY = "secret_lambda-user-key-0123456789"


def _aged(path: Path, seconds_ago: float) -> None:
    path.write_text("x")
    then = time.time() - seconds_ago
    os.utime(path, (then, then))


def test_due_only_after_training_ended_and_nobody_came_for_the_minutes(tmp_path: Path) -> None:
    now = time.time()
    assert not due(tmp_path, 1, now), "training has not ended"
    _aged(tmp_path / STOP_MARKER_NAME, 30)
    assert not due(tmp_path, 1, now), "ended 30 s ago, one minute asked"
    _aged(tmp_path / STOP_MARKER_NAME, 120)
    assert due(tmp_path, 1, now)
    _aged(tmp_path / HEARTBEAT_NAME, 10)
    assert not due(tmp_path, 1, now), "the desktop was here 10 s ago: it terminates the machine itself"


def test_not_due_while_the_courier_sends_a_checkpoint_to_the_bucket(tmp_path: Path) -> None:
    now = time.time()
    _aged(tmp_path / STOP_MARKER_NAME, 3600)
    (tmp_path / COURIER_DIR_NAME).mkdir()
    _aged(tmp_path / COURIER_DIR_NAME / COURIER_BUSY_NAME, 20)
    assert not due(tmp_path, 1, now), "the courier touched BUSY 20 s ago: the last checkpoint is on its way"
    _aged(tmp_path / COURIER_DIR_NAME / COURIER_BUSY_NAME, COURIER_BUSY_SECONDS + 1)
    assert due(tmp_path, 1, now), "a courier that stopped making progress does not keep the machine billing"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "unreadable"),
        ("[1]", "unreadable"),
        ('{"provider": "aws", "api_url": "https://x", "minutes": 5}', "known provider"),
        ('{"provider": "vast", "api_url": "https://x", "minutes": 0}', "minutes > 0"),
        ('{"provider": "vast", "api_url": "https://x", "minutes": NaN}', "minutes > 0"),
        ('{"provider": "vast", "api_url": "https://x", "minutes": 5, "poll_seconds": 0}', "polls every"),
        ('{"provider": "vast", "api_url": "file:///etc/passwd", "minutes": 5}', "API URL"),
        ('{"provider": "vast", "minutes": 5}', "API URL"),
        ('{"provider": "runpod", "minutes": 5, "graphql_url": "ftp://x"}', "API URL"),
    ],
)
def test_bad_settings_are_refused(text: str, words: str) -> None:
    with pytest.raises(SelfStopError, match=words):
        SelfStopConfig.from_json(text)


def test_a_lambda_key_is_never_shown_with_the_settings() -> None:
    settings = {"provider": "lambda", "api_url": "https://x", "minutes": 5, "api_key": LAMBDA_KEY}
    config = SelfStopConfig.from_json(json.dumps(settings))
    assert config.api_key == LAMBDA_KEY and LAMBDA_KEY not in repr(config)


@pytest.mark.parametrize(
    ("settings", "v2", "graphql"),
    [
        ({}, RUNPOD_V2_URL, "https://api.runpod.io/graphql"),
        ({"api_url": "https://api.runpod.io/v2/"}, RUNPOD_V2_URL, "https://api.runpod.io/graphql"),
        ({"api_url": "http://h:9/v2", "graphql_url": "http://h:8/gql"}, "http://h:9/v2", "http://h:8/gql"),
        # Settings stored before REST v2 (a run armed then, resumed now) named the GraphQL endpoint as api_url.
        ({"api_url": "https://api.runpod.io/graphql"}, RUNPOD_V2_URL, "https://api.runpod.io/graphql"),
        ({"api_url": "http://127.0.0.1:9"}, "http://127.0.0.1:9", "http://127.0.0.1:9/graphql"),
    ],
)
def test_runpods_urls_are_its_rest_v2_base_and_its_graphql_endpoint_beside_it(
    settings: dict[str, str], v2: str, graphql: str
) -> None:
    config = SelfStopConfig.from_json(json.dumps({"provider": "runpod", "minutes": 5, **settings}))
    assert (config.api_url, config.graphql_url) == (v2, graphql)


def test_the_machines_own_variables_come_from_the_container_when_the_session_lacks_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = tmp_path / "environ"
    environ.write_bytes(b"PATH=/usr/bin\0RUNPOD_POD_ID=abc123\0")
    monkeypatch.delenv("RUNPOD_POD_ID", raising=False)
    assert machine_variable("RUNPOD_POD_ID", environ) == "abc123"
    monkeypatch.setenv("RUNPOD_POD_ID", "from-session")
    assert machine_variable("RUNPOD_POD_ID", environ) == "from-session"
    assert machine_variable("MISSING", tmp_path / "nothing") == ""


def test_each_provider_gets_its_own_terminate_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_POD_ID", "pod1")
    monkeypatch.setenv("RUNPOD_API_KEY", "pod-key")
    monkeypatch.setenv("CONTAINER_ID", "77")
    monkeypatch.setenv("CONTAINER_API_KEY", "vast-key")
    rest, graphql = terminate_requests(SelfStopConfig("runpod", RUNPOD_V2_URL, 5))
    assert (rest.get_method(), rest.full_url, rest.data) == ("DELETE", "https://api.runpod.io/v2/pods/pod1", None)
    assert (graphql.get_method(), graphql.full_url) == ("POST", "https://api.runpod.io/graphql")
    assert rest.get_header("Authorization") == graphql.get_header("Authorization") == "Bearer pod-key"
    assert json.loads(graphql.data or b"")["variables"] == {"id": "pod1"}  # type: ignore[arg-type]
    [vast] = terminate_requests(SelfStopConfig("vast", "https://console.vast.ai/api/v0", 5))
    assert (vast.get_method(), vast.full_url) == ("DELETE", "https://console.vast.ai/api/v0/instances/77/")
    [lam] = terminate_requests(SelfStopConfig("lambda", "https://cloud.lambda.ai/api/v1", 5, "i-9", "user-key"))
    assert (
        lam.full_url.endswith("/instance-operations/terminate") and lam.get_header("Authorization") == "Bearer user-key"
    )
    monkeypatch.setenv("RUNPOD_POD_ID", "$(reboot)")
    with pytest.raises(SelfStopError, match="not a plain id"):
        terminate_requests(SelfStopConfig("runpod", RUNPOD_V2_URL, 5))


def test_the_head_of_a_runpod_cluster_deletes_the_whole_cluster_with_the_users_key() -> None:
    """A member pod cannot be deleted on its own (409): the head deletes the cluster, with the key the user sent."""
    [delete] = terminate_requests(SelfStopConfig("runpod", RUNPOD_V2_URL, 5, "cluster:c7f31a", "user-key"))
    assert (delete.get_method(), delete.full_url) == ("DELETE", "https://api.runpod.io/v2/clusters/c7f31a")
    assert delete.get_header("Authorization") == "Bearer user-key"
    with pytest.raises(SelfStopError, match="no API key"):
        terminate_requests(SelfStopConfig("runpod", RUNPOD_V2_URL, 5, "cluster:c7f31a"))
    with pytest.raises(SelfStopError, match="not a plain id"):
        terminate_requests(SelfStopConfig("runpod", RUNPOD_V2_URL, 5, "cluster:../pods/x", "user-key"))


@dataclass
class Seen:
    """One request a :class:`Provider` received."""

    method: str
    path: str
    bearer: str
    body: Any


@dataclass
class Provider:
    """A stand-in provider API on 127.0.0.1: answers (method, path) with a status and a JSON body, and records."""

    answers: dict[tuple[str, str], tuple[int, Any]]
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    def handle(self, method: str, path: str, bearer: str, body: bytes) -> tuple[int, bytes]:
        self.seen.append(Seen(method, path, bearer, json.loads(body) if body else None))
        status, answer = self.answers.get((method, path), (404, {"title": "Not Found", "status": 404}))
        return status, b"" if answer is None else json.dumps(answer).encode()


@pytest.fixture
def provider() -> Iterator[Provider]:
    fake = Provider({})

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            bearer = (self.headers.get("authorization") or "").removeprefix("Bearer ")
            status, answer = fake.handle(self.command, self.path, bearer, body)
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = do_DELETE = _any  # noqa: N815 - http.server's names

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


GRAPHQL_DONE = (200, {"data": {"podTerminate": None}})


def test_runpod_deletes_the_pod_through_rest_v2_with_the_pods_own_key(
    provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNPOD_POD_ID", "pod1")
    monkeypatch.setenv("RUNPOD_API_KEY", "pod-key")
    provider.answers = {("DELETE", "/v2/pods/pod1"): (204, None), ("POST", "/graphql"): GRAPHQL_DONE}
    assert terminate(SelfStopConfig("runpod", f"{provider.url}/v2", 5)) == "HTTP 204"
    assert [(s.method, s.path, s.bearer) for s in provider.seen] == [("DELETE", "/v2/pods/pod1", "pod-key")]


@pytest.mark.parametrize("status", [404, 405, 401, 403])
def test_runpod_falls_back_to_graphql_where_rest_v2_does_not_take_the_call(
    provider: Provider, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    monkeypatch.setenv("RUNPOD_POD_ID", "pod1")
    monkeypatch.setenv("RUNPOD_API_KEY", "pod-key")
    provider.answers = {("DELETE", "/v2/pods/pod1"): (status, {"status": status}), ("POST", "/gql"): GRAPHQL_DONE}
    urls = {"api_url": f"{provider.url}/v2", "graphql_url": f"{provider.url}/gql"}
    config = SelfStopConfig.from_json(json.dumps({"provider": "runpod", "minutes": 5, **urls}))
    assert "podTerminate" in terminate(config)
    assert [(s.method, s.path, s.bearer) for s in provider.seen] == [
        ("DELETE", "/v2/pods/pod1", "pod-key"),
        ("POST", "/gql", "pod-key"),
    ]
    assert provider.seen[1].body["variables"] == {"id": "pod1"}


@pytest.mark.parametrize(
    ("answers", "words"),
    [
        ({("DELETE", "/v2/pods/pod1"): (500, {"detail": "upstream"})}, "HTTP 500"),
        ({("DELETE", "/v2/pods/pod1"): (409, {"detail": "cluster member"})}, "HTTP 409"),
        ({("POST", "/graphql"): (200, {"errors": [{"message": "pod not found to terminate"}]})}, "pod not found"),
    ],
)
def test_other_refusals_are_no_reason_to_try_graphql_and_are_retried_later(
    provider: Provider, monkeypatch: pytest.MonkeyPatch, answers: dict[tuple[str, str], tuple[int, Any]], words: str
) -> None:
    monkeypatch.setenv("RUNPOD_POD_ID", "pod1")
    monkeypatch.setenv("RUNPOD_API_KEY", "pod-key")
    provider.answers = answers
    with pytest.raises(ProviderRefusedError, match=words):
        terminate(SelfStopConfig("runpod", f"{provider.url}/v2", 5))
    assert len(provider.seen) == (2 if ("POST", "/graphql") in answers else 1)


def _rent(
    monkeypatch: pytest.MonkeyPatch, fake: FakeCloud, name: ProviderName, url_env: str, url: str, key_env: str
) -> str:
    monkeypatch.setenv(url_env, url)  # (set directly, they leaked into the worker's later tests)
    monkeypatch.setenv(key_env, fake.valid_key)

    async def rent() -> str:
        provider = open_provider(name)
        try:
            [offer, *_] = await provider.offers(OfferQuery())
            return (await provider.create(RentRequest(offer, KEY_LINE, "rentune-x", "img"))).instance_id
        finally:
            await provider.aclose()

    return asyncio.run(rent())


def test_a_vast_machine_terminates_itself_with_its_own_key_and_only_itself(
    fake_vast: FakeCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fake_vast.serve() + "/api/v0"
    mine = _rent(monkeypatch, fake_vast, ProviderName.VAST, "RENTUNE_VAST_URL", url, "VAST_API_KEY")
    other = _rent(monkeypatch, fake_vast, ProviderName.VAST, "RENTUNE_VAST_URL", url, "VAST_API_KEY")
    monkeypatch.setenv("CONTAINER_ID", other)
    monkeypatch.setenv("CONTAINER_API_KEY", f"instance-scoped-{mine}")
    with pytest.raises(SelfStopError, match="refused"):
        send(*terminate_requests(SelfStopConfig("vast", url, 5)))
    monkeypatch.setenv("CONTAINER_ID", mine)
    send(*terminate_requests(SelfStopConfig("vast", url, 5)))
    assert fake_vast.instances[mine].terminated is not None and fake_vast.instances[other].terminated is None


def _self_stop(
    folder: Path, settings: dict[str, Any], env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Runs the self-stop as the desktop starts it: settings on stdin, output into ``out/self_stop.log``."""
    with (folder / "out" / "self_stop.log").open("a") as log:
        return subprocess.run(
            [sys.executable, "-m", "trainer_payload.self_stop", *args],
            check=False,
            cwd=folder,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(PAYLOAD_ROOT), **env},
            input=json.dumps(settings) + "\n",
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
        )


def test_the_self_stop_process_terminates_a_runpod_pod_once_due(
    fake_runpod: FakeCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fake_runpod.serve()
    pod = _rent(monkeypatch, fake_runpod, ProviderName.RUNPOD, "RENTUNE_RUNPOD_URL", url, "RUNPOD_API_KEY")
    (tmp_path / "out").mkdir()
    _aged(tmp_path / "out" / STOP_MARKER_NAME, 120)
    settings = {"provider": "runpod", "api_url": url, "minutes": 1, "poll_seconds": 0.2}
    done = _self_stop(tmp_path, settings, {"RUNPOD_POD_ID": pod, "RUNPOD_API_KEY": f"pod-scoped-{pod}"})
    log = (tmp_path / "out" / "self_stop.log").read_text()
    assert done.returncode == 0, log
    assert "terminated this machine" in log
    assert fake_runpod.instances[pod].terminated is not None


def test_the_self_stop_process_deletes_a_runpod_cluster_once_due(fake_runpod: FakeRunPod, tmp_path: Path) -> None:
    url = fake_runpod.serve()

    async def rent_cluster() -> str:
        client = RunPodProvider(fake_runpod.valid_key, base_url=url)
        try:
            (offer,) = await client.offers(OfferQuery(gpu="RTX 4090", count=1, nodes=2))
            return (await client.create(RentRequest(offer, KEY_LINE, "rentune-x", "img"))).instance_id
        finally:
            await client.aclose()

    cluster = asyncio.run(rent_cluster())
    (tmp_path / "out").mkdir()
    _aged(tmp_path / "out" / STOP_MARKER_NAME, 120)
    settings = {"provider": "runpod", "api_url": url, "minutes": 1, "poll_seconds": 0.2, "instance_id": cluster}
    done = _self_stop(tmp_path, {**settings, "api_key": fake_runpod.valid_key}, {})
    log = (tmp_path / "out" / "self_stop.log").read_text()
    assert done.returncode == 0, log
    assert "terminated this machine" in log and fake_runpod.valid_key not in log
    (book,) = fake_runpod.clusters.values()
    assert book.deleted is not None and all(pod.terminated is not None for pod in fake_runpod.member_pods(book.id))


def _wait_for(check: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0


def test_detached_the_lambda_key_lives_only_in_the_watchers_memory(provider: Provider, tmp_path: Path) -> None:
    provider.answers = {("POST", "/api/v1/instance-operations/terminate"): (200, {"data": {"terminated": []}})}
    (tmp_path / "out").mkdir()
    settings = {
        "provider": "lambda",
        "api_url": f"{provider.url}/api/v1",
        "minutes": 1,
        "instance_id": "i-9",
        "api_key": LAMBDA_KEY,
        "poll_seconds": 0.2,
    }
    started = time.monotonic()
    done = _self_stop(tmp_path, settings, {}, "--detach", "out/self_stop.pid")
    assert done.returncode == 0 and time.monotonic() - started < 20, "the starting command ends at once"
    watcher = int((tmp_path / "out" / "self_stop.pid").read_text())
    try:
        assert os.getsid(watcher) != os.getsid(0), "a session of its own: a logout does not end it"
        assert str(Path(f"/proc/{watcher}/fd/0").readlink()) == os.devnull, "stdin let go"
        assert LAMBDA_KEY.encode() not in Path(f"/proc/{watcher}/environ").read_bytes()
        assert LAMBDA_KEY.encode() not in Path(f"/proc/{watcher}/cmdline").read_bytes()
        assert b"self_stop" in Path(f"/proc/{watcher}/cmdline").read_bytes(), "the desktop recognises it"
        _aged(tmp_path / "out" / STOP_MARKER_NAME, 120)  # training ended two minutes ago, nobody came
        _wait_for(lambda: _gone(watcher))
    finally:
        if not _gone(watcher):
            os.kill(watcher, 9)
    assert [(s.path, s.bearer, s.body) for s in provider.seen] == [
        ("/api/v1/instance-operations/terminate", LAMBDA_KEY, {"instance_ids": ["i-9"]})
    ]
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or LAMBDA_KEY.encode() not in path.read_bytes(), f"the key reached {path}"
    assert "terminated this machine" in (tmp_path / "out" / "self_stop.log").read_text()


def test_the_desktop_starts_one_self_stop_over_ssh_and_the_command_ends_at_once(
    ssh_host: SshHost, provider: Provider, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "payload").symlink_to(PAYLOAD_ROOT, target_is_directory=True)  # the uploaded payload
    settings = {"provider": "lambda", "api_url": provider.url, "minutes": 60, "instance_id": "i-9"}
    settings |= {"api_key": LAMBDA_KEY, "poll_seconds": 30}

    async def arm_twice() -> float:
        login = Endpoint(ssh_host.host, ssh_host.port, ssh_host.user, (ssh_host.client_key,))
        machine = await RemoteMachine.connect(login, None)
        try:
            started = time.monotonic()
            for _ in range(2):
                await machine.run(arm_command(str(run), sys.executable), stdin=json.dumps(settings) + "\n")
            return time.monotonic() - started
        finally:
            await machine.close()

    took = asyncio.run(arm_twice())
    watcher = int((run / PID_FILE).read_text())
    try:
        assert took < 20, "each command ends once the self-stop has detached"
        assert not _gone(watcher)
        assert LAMBDA_KEY.encode() not in Path(f"/proc/{watcher}/environ").read_bytes()
        log = (run / "out" / "self_stop.log").read_text()
        assert log.count("self-stop armed") == 1, "the second command found it running and started none"
        assert LAMBDA_KEY not in log
    finally:
        os.kill(watcher, 9)
