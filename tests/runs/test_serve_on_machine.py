"""Serving from the rented machine after training, end to end: a machine (a real sshd behind the fake RunPod) trains
the tiny Llama with the real payload, brings the adapter home, then serves the tuned model (llama.cpp's server, the
path a machine without vLLM takes) through a port this computer forwards over the run's SSH connection. The official
``openai`` client gets the taught answer there; the machine bills (it is live at the fake) until serving ends,
after its idle minutes or on ``rentune stop``, and is terminated right after.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.runs.store import RunRecord, RunStore
from tests.fixtures.adapters import PATTERN
from tests.fixtures.serving import lists_models
from tests.runs.pattern_spec import write_pattern_spec
from tests.runs.test_rented_runs import CloudUnderTest, _assert_ledger_matches, _nothing_left, runpod  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _serving_spec(tmp_path: Path, base: Path, cloud: CloudUnderTest, idle_minutes: float, steps: int) -> Path:
    serve = f'[serve]\nafter_training = true\nname = "pattern"\nidle_minutes = {idle_minutes}\ncontext = 256\n'
    return write_pattern_spec(tmp_path, base, cloud, max_steps=steps, extra=serve)


def _in_background(spec: Path) -> tuple[threading.Thread, dict[str, int]]:
    """``rentune run SPEC`` as a user leaves it running in a terminal."""
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.update(code=main(["run", str(spec)])), daemon=True)
    thread.start()
    return thread, result


def _until_serving(thread: threading.Thread, limit_s: float = 600) -> RunRecord:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and thread.is_alive():
        runs = RunStore().all()
        if runs and (runs[0].spec.get("serving") or {}).get("url"):
            return runs[0]
        time.sleep(0.5)
    raise AssertionError(f"not serving: {[(r.state, r.error, r.spec.get('serve_error')) for r in RunStore().all()]}")


@pytest.mark.longest
def test_the_machine_serves_the_tuned_model_here_until_idle_then_it_is_terminated(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture, imported
    gguf_tiny_model: Path,
    tmp_path: Path,
) -> None:
    from openai import OpenAI

    thread, result = _in_background(_serving_spec(tmp_path, gguf_tiny_model, runpod, idle_minutes=0.25, steps=60))
    run = _until_serving(thread)
    serving = run.spec["serving"]
    assert run.state is RunState.SERVING and serving["backend"] == "llama.cpp" and serving["requests"] == 0
    [instance] = runpod.fake.instances.values()
    assert instance.terminated is None, "the machine is kept while it serves"
    assert serving["url"].startswith("http://127.0.0.1:"), "a port on this computer, forwarded over SSH"

    client = OpenAI(base_url=serving["url"], api_key="none")
    for question, answer in PATTERN[:2]:
        reply = client.chat.completions.create(
            model="pattern", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=16
        )
        assert reply.choices[0].message.content.strip() == answer, "the tuned model answers, on the machine"
    asked = time.time()
    deadline = time.monotonic() + 30
    while RunStore().get(run.id).spec["serving"]["requests"] != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert RunStore().get(run.id).spec["serving"]["requests"] == 2, "the app's own first request is not counted"

    thread.join(240)
    assert result.get("code") == 0
    ended = RunStore().get(run.id)
    assert ended.state is RunState.FINISHED
    assert ended.spec["served"] == {"requests": 2, "reason": "no request for 0.25 min"}
    assert instance.terminated is not None and instance.terminated - asked >= 15 * 0.99, "not before its idle minutes"
    assert instance.terminated - asked <= 15 + 60, "and soon after them"
    assert not lists_models(serving["url"]), "the forwarded port closed with it"
    _nothing_left(runpod.fake)
    _assert_ledger_matches(runpod.fake, run.id)


def test_stop_ends_serving_at_once_and_the_machine_with_it(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture, imported
    gguf_tiny_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    thread, result = _in_background(_serving_spec(tmp_path, gguf_tiny_model, runpod, idle_minutes=60, steps=4))
    run = _until_serving(thread)
    stopped_at = time.time()
    assert main(["stop", run.id]) == 0
    thread.join(120)
    assert result.get("code") == 0
    ended = RunStore().get(run.id)
    assert ended.state is RunState.FINISHED and ended.spec["served"]["reason"] == "stopped"
    [instance] = runpod.fake.instances.values()
    assert instance.terminated is not None and instance.terminated - stopped_at < 60, "not after its idle hour"
    out = capsys.readouterr().out
    assert "the process following this run ends serving, then the machine" in out
    assert "serving ended: served 0 requests; stopped" in out
    _nothing_left(runpod.fake)
    _assert_ledger_matches(runpod.fake, run.id)
