"""Serving on the machine after training (``python -m trainer_payload serve``), run as the app starts it.

Real parts: the tiny Llama taught the pattern, merged and converted by llama.cpp's own converter, served by
llama-cpp-python's server (the path a machine without vLLM takes) and asked by the official ``openai`` client. The
whole life on a rented machine (forwarded port, billing, the machine ended after): tests/runs/test_serve_on_machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fixtures.adapters import PATTERN, TrainedAdapter
from tests.fixtures.serving import lists_models
from tests.gpu.serve_check import read_state as _state
from tests.gpu.serve_check import wait_for, wait_for_requests
from trainer_payload.protocol import (
    ADAPTER_DIR_NAME,
    SERVE_DIR_NAME,
    SERVE_STATE_FILE_NAME,
    ServePhase,
    ServeState,
)
from trainer_payload.serve import (
    ServeJobError,
    llama_cpp_command,
    lora_rank_for_vllm,
    read_serve_job,
    vllm_command,
)

pytestmark = pytest.mark.timeout(300)


def _converters() -> Path:
    from desktop.services.local.common import no_progress
    from desktop.services.local.llama_cpp_source import llama_cpp_converters

    return asyncio.run(llama_cpp_converters(no_progress)).root


def _run_folder(tmp_path: Path, adapter: TrainedAdapter, **serve: object) -> tuple[Path, Path]:
    out = tmp_path / "out"
    shutil.copytree(adapter.path, out / ADAPTER_DIR_NAME)
    job = tmp_path / "job.json"
    spec = {"base_model": str(adapter.base), "train_file": "t.jsonl", "output_dir": str(out), "lora_r": 8}
    job.write_text(json.dumps(spec))
    serve_job = out / "serve-job.json"
    defaults = {"name": "pattern", "idle_minutes": 5, "start_minutes": 2, "context": 256, "backend": "auto"}
    serve_job.write_text(json.dumps(defaults | {"converters": str(_converters())} | serve))
    return job, serve_job


def _start(job: Path, serve_job: Path) -> subprocess.Popen[bytes]:
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(root)}
    return subprocess.Popen(
        [sys.executable, "-m", "trainer_payload", "serve", str(job), str(serve_job)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _until(out: Path, phase: ServePhase, limit_s: float = 240) -> ServeState:
    """The serve state once it reaches ``phase``; fails when serving ends first or ``limit_s`` passes."""
    state = wait_for(out, {phase, ServePhase.ENDED}, limit_s)
    if state is not None and state.phase is phase:
        return state
    if state is not None and state.phase is ServePhase.ENDED:
        raise AssertionError(f"serving ended before {phase.value}: {state.reason}")
    raise AssertionError(f"no {phase.value} within {limit_s} s: {state}")


def _until_counted(out: Path, requests: int, limit_s: float = 30) -> ServeState:
    """The serve state once it counts ``requests`` requests, exactly that many."""
    counted = wait_for_requests(out, requests, limit_s)
    assert counted == requests, f"{counted} request(s) counted within {limit_s} s, {requests} made"
    state = _state(out)
    assert state is not None
    return state


def test_the_tuned_model_is_served_counted_and_ended_after_its_idle_minutes(
    gguf_pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    from openai import OpenAI

    job, serve_job = _run_folder(tmp_path, gguf_pattern_adapter, idle_minutes=0.1)
    out = serve_job.parent
    process = _start(job, serve_job)
    try:
        state = _until(out, ServePhase.SERVING)
        assert state.backend == "llama.cpp" and state.model == "pattern" and state.requests == 0
        assert (out / SERVE_DIR_NAME / "model-Q8_0.gguf").is_file(), "the merged model, converted for llama.cpp"
        url = f"http://127.0.0.1:{state.port}/v1"
        client = OpenAI(base_url=url, api_key="none")
        question, answer = PATTERN[0]
        reply = client.chat.completions.create(
            model="pattern", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=16
        )
        assert reply.choices[0].message.content.strip() == answer, "the taught answer, from the merged model"
        asked = time.time()
        served = _until_counted(out, 1)  # counted from the server's access log, on the wrapper's next look
        assert served.last_request_at >= served.ready_at
        assert process.wait(60) == 0
        ended = _state(out)
        assert ended is not None and ended.phase is ServePhase.ENDED and ended.reason == "no request for 0.1 min"
        assert time.time() - asked >= 6 * 0.99, "not before its idle minutes"
        assert not lists_models(url), "the server ended with it"
    finally:
        process.kill()
        process.wait()  # reaped here, not by the garbage collector in a later test


def test_a_stop_ends_the_server_and_a_killed_wrapper_takes_its_server_along(
    gguf_pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    job, serve_job = _run_folder(tmp_path / "stopped", gguf_pattern_adapter)
    out = serve_job.parent
    process = _start(job, serve_job)
    try:
        state = _until(out, ServePhase.SERVING)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        ended = _state(out)
        assert ended is not None and ended.reason == "stopped" and not lists_models(f"http://127.0.0.1:{state.port}/v1")
        made = out / SERVE_DIR_NAME / "model-Q8_0.gguf"
        assert made.is_file()

        job, serve_job = _run_folder(tmp_path / "killed", gguf_pattern_adapter)
        (serve_job.parent / SERVE_DIR_NAME).mkdir()
        shutil.copy(made, serve_job.parent / SERVE_DIR_NAME / made.name)  # made once: not converted again
        process = _start(job, serve_job)
        state = _until(serve_job.parent, ServePhase.SERVING)
        process.kill()
        process.wait(10)
        deadline = time.monotonic() + 30
        while lists_models(f"http://127.0.0.1:{state.port}/v1") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not lists_models(f"http://127.0.0.1:{state.port}/v1"), "no server outlives its wrapper"
    finally:
        process.kill()
        process.wait()  # reaped here, not by the garbage collector in a later test


@pytest.mark.parametrize(
    ("job", "problem"),
    [
        ({"name": "a b"}, "letters, digits"),
        ({"idle_minutes": 0}, "idle_minutes = 0"),
        ({"context": True}, "context = True"),
        ({"backend": "tgi"}, "backend = 'tgi'"),
    ],
)
def test_a_serve_job_it_cannot_do_is_refused_with_the_field(
    tmp_path: Path, job: dict[str, object], problem: str
) -> None:
    path = tmp_path / "serve-job.json"
    defaults = {"name": "m", "idle_minutes": 5, "start_minutes": 2, "context": 256}
    path.write_text(json.dumps(defaults | job))
    with pytest.raises(ServeJobError, match=problem):
        read_serve_job(path)


def test_vllm_serves_the_base_with_the_adapter_as_a_named_lora_module_of_a_rank_it_accepts() -> None:
    command = vllm_command(Path("/m/base"), Path("/r/out/adapter"), name="tuned", rank=12, context=4096, port=8123)
    assert command[0] == "vllm.entrypoints.openai.api_server"
    assert command[command.index("--lora-modules") + 1] == "tuned=/r/out/adapter" and "--enable-lora" in command
    assert command[command.index("--max-lora-rank") + 1] == "16", "12 is no rank vLLM takes: the next one up"
    assert command[command.index("--host") + 1] == "127.0.0.1", "reached only through the app's SSH forward"
    assert [lora_rank_for_vllm(r) for r in (8, 64, 65, 4096)] == [8, 64, 128, 512]
    assert llama_cpp_command(Path("/s/m.gguf"), "tuned", 256, 9)[:5] == [
        "llama_cpp.server", "--model", "/s/m.gguf", "--model_alias", "tuned",
    ]  # fmt: skip


def test_a_state_a_machine_wrote_is_checked_field_by_field() -> None:
    good = ServeState(ServePhase.SERVING, pid=5, backend="vllm", port=8000, model="m", requests=3)
    assert ServeState.parse(good.to_json()) == good
    for bad in ({"phase": "dancing"}, {"port": 70000}, {"requests": -1}, {"backend": "x" * 80}, {"ready_at": "soon"}):
        with pytest.raises(ValueError):
            ServeState.parse(json.dumps(json.loads(good.to_json()) | bad))
    with pytest.raises(ValueError):
        ServeState.parse("[1, 2]")


def test_a_port_another_program_takes_first_is_left_for_the_next_and_its_answer_is_not_mistaken_for_ours(
    gguf_pattern_adapter: TrainedAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI: between choosing a free port and the server binding it, another program (an sshd) took it."""
    import socket
    import threading

    from trainer_payload import serve
    from trainer_payload.protocol import JobSpec

    squatter = socket.create_server(("127.0.0.1", 0))
    taken = squatter.getsockname()[1]

    def banner() -> None:
        while True:
            try:
                connection, _ = squatter.accept()
            except OSError:
                return
            connection.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u10\r\n")
            connection.close()

    threading.Thread(target=banner, daemon=True).start()
    ports = iter([taken, serve.free_port()])
    monkeypatch.setattr(serve, "free_port", lambda: next(ports))
    job, serve_job = _run_folder(tmp_path, gguf_pattern_adapter)
    out = serve_job.parent
    keeper = serve.StateKeeper(out / SERVE_STATE_FILE_NAME, ServeState(ServePhase.PREPARING))
    server = serve.ModelServer(JobSpec.load(job), serve.read_serve_job(serve_job), keeper)
    assert not server._answers(replace(keeper.state, port=taken)), "an SSH banner is no model list"
    ended: list[str] = []
    thread = threading.Thread(target=lambda: ended.append(server.serve()), daemon=True)
    thread.start()
    try:
        state = _until(out, ServePhase.SERVING)
        assert state.port != taken and lists_models(f"http://127.0.0.1:{state.port}/v1")
    finally:
        server.stopping.set()
        thread.join(60)
        squatter.close()
    assert ended == ["stopped"]
