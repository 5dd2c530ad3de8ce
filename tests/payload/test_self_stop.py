"""The machine's self-stop: when it is due, what it sends to each provider, and that the fakes obey it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from desktop.services.providers.base import OfferQuery, ProviderName, RentRequest
from desktop.services.providers.registry import open_provider
from tests.fakes.http import FakeCloud
from trainer_payload.protocol import HEARTBEAT_NAME, SELF_STOP_ENV, STOP_MARKER_NAME
from trainer_payload.self_stop import (
    SelfStopConfig,
    SelfStopError,
    due,
    machine_variable,
    send,
    terminate_request,
)

KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf2lCXjVHZmIeOaVG7CXHPBBpU1KLdmkLmNbdzN8YKc x"
PAYLOAD_ROOT = Path(__file__).parents[2]


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


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "unreadable"),
        ('{"provider": "aws", "api_url": "https://x", "minutes": 5}', "known provider"),
        ('{"provider": "vast", "api_url": "https://x", "minutes": 0}', "minutes > 0"),
        ('{"provider": "vast", "api_url": "file:///etc/passwd", "minutes": 5}', "API URL"),
    ],
)
def test_bad_settings_are_refused(text: str, words: str) -> None:
    with pytest.raises(SelfStopError, match=words):
        SelfStopConfig.from_json(text)


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


def test_each_provider_gets_its_own_terminate_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_POD_ID", "pod1")
    monkeypatch.setenv("RUNPOD_API_KEY", "pod-key")
    monkeypatch.setenv("CONTAINER_ID", "77")
    monkeypatch.setenv("CONTAINER_API_KEY", "vast-key")
    runpod = terminate_request(SelfStopConfig("runpod", "https://api.runpod.io/graphql", 5))
    assert runpod.get_method() == "POST" and runpod.get_header("Authorization") == "Bearer pod-key"
    assert json.loads(runpod.data or b"")["variables"] == {"id": "pod1"}  # type: ignore[arg-type]
    vast = terminate_request(SelfStopConfig("vast", "https://console.vast.ai/api/v0", 5))
    assert (vast.get_method(), vast.full_url) == ("DELETE", "https://console.vast.ai/api/v0/instances/77/")
    lam = terminate_request(SelfStopConfig("lambda", "https://cloud.lambda.ai/api/v1", 5, "i-9", "user-key"))
    assert (
        lam.full_url.endswith("/instance-operations/terminate") and lam.get_header("Authorization") == "Bearer user-key"
    )
    monkeypatch.setenv("RUNPOD_POD_ID", "$(reboot)")
    with pytest.raises(SelfStopError, match="not a plain id"):
        terminate_request(SelfStopConfig("runpod", "https://api.runpod.io/graphql", 5))


def _rent(fake: FakeCloud, name: ProviderName, url_env: str, url: str, key_env: str) -> str:
    os.environ[url_env], os.environ[key_env] = url, fake.valid_key

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
    mine = _rent(fake_vast, ProviderName.VAST, "RENTUNE_VAST_URL", url, "VAST_API_KEY")
    other = _rent(fake_vast, ProviderName.VAST, "RENTUNE_VAST_URL", url, "VAST_API_KEY")
    monkeypatch.setenv("CONTAINER_ID", other)
    monkeypatch.setenv("CONTAINER_API_KEY", f"instance-scoped-{mine}")
    with pytest.raises(SelfStopError, match="refused"):
        send(terminate_request(SelfStopConfig("vast", url, 5)))
    monkeypatch.setenv("CONTAINER_ID", mine)
    send(terminate_request(SelfStopConfig("vast", url, 5)))
    assert fake_vast.instances[mine].terminated is not None and fake_vast.instances[other].terminated is None


def test_the_self_stop_process_terminates_a_runpod_pod_once_due(
    fake_runpod: FakeCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fake_runpod.serve()
    pod = _rent(fake_runpod, ProviderName.RUNPOD, "RENTUNE_RUNPOD_URL", url, "RUNPOD_API_KEY")
    (tmp_path / "out").mkdir()
    _aged(tmp_path / "out" / STOP_MARKER_NAME, 120)
    config = {"provider": "runpod", "api_url": url, "minutes": 1, "poll_seconds": 0.2}
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(PAYLOAD_ROOT),
        SELF_STOP_ENV: json.dumps(config),
        "RUNPOD_POD_ID": pod,
        "RUNPOD_API_KEY": f"pod-scoped-{pod}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "trainer_payload.self_stop"],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "terminated this machine" in done.stdout
    assert fake_runpod.instances[pod].terminated is not None
