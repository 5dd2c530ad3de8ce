"""``make gpu-check``'s serving pass: vLLM serving the tuned adapter as a LoRA module, what the CPU tests cannot show.

The tests prove serving on the machine with llama-cpp-python's server, the path a machine without vLLM or a GPU
takes. With vLLM installed and a CUDA GPU, this pass serves an adapter the payload just trained: it starts
``python -m trainer_payload serve`` with ``backend = "vllm"`` as the app does (``--enable-lora``, the adapter as a
named module, ``--max-lora-rank`` from the run), waits for the serve state the app reads to say it serves, asks it
by the adapter's name (a warm-up, then a measured answer of a fixed length), checks that both requests were counted,
and stops it as the app's Stop does (SIGTERM), after which nothing may answer on its port. Without vLLM or a GPU it
says so and runs nothing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trainer_payload.protocol import SERVE_STATE_FILE_NAME, ServePhase, ServeState

#: The name requests give for the tuned model (the LoRA module's name).
SERVED_NAME = "tuned"
#: The measured answer's length: vLLM is asked to ignore the end-of-turn token so that every run counts as many.
MEASURED_TOKENS = 128
SERVE_CONTEXT = 1024
NO_VLLM = (
    "skipped: vLLM is not installed here (it comes with vLLM's own image, vllm/vllm-openai; its wheels are far too "
    "large to carry to a machine without network)"
)
_HAS_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


@dataclass
class ServeRow:
    """The serving pass: its verdict (``ok: ...``, ``failed: ...``, ``skipped...``) and what it measured."""

    status: str
    ready_s: float | None = None
    tokens_per_s: float | None = None
    requests: int = 0
    detail: str = ""


def vllm_installed(env: dict[str, str]) -> bool:
    """Whether the payload's Python (with ``env``: the carried wheels on its path) can import vLLM."""
    return subprocess.run([sys.executable, "-c", _HAS_VLLM], env=env, check=False).returncode == 0


def write_serve_job(out: Path, limit_s: float, backend: str, extra: dict[str, str]) -> Path:
    """The serve job the app would send for ``[serve] backend = ...``, in the trained run's output folder."""
    job = {
        "name": SERVED_NAME,
        "idle_minutes": 10,
        "start_minutes": max(1.0, limit_s / 60),
        "context": SERVE_CONTEXT,
        "backend": backend,
        **extra,
    }
    path = out / "serve-job.json"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def read_state(out: Path) -> ServeState | None:
    """The serve state the machine keeps, as the app reads it (None before the first one)."""
    try:
        return ServeState.parse((out / SERVE_STATE_FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def wait_for(out: Path, done: set[ServePhase], limit_s: float) -> ServeState | None:
    """Polls the serve state until its phase is one of ``done`` or ``limit_s`` passes; returns the last state."""
    deadline = time.monotonic() + limit_s
    state = read_state(out)
    while time.monotonic() < deadline and (state is None or state.phase not in done):
        time.sleep(0.5)
        state = read_state(out)
    return state


def ask(port: int, max_tokens: int) -> tuple[int, float]:
    """One chat completion by the adapter's name; returns the completion's tokens and the seconds it took."""
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.loads(response.read())
    return int(reply["usage"]["completion_tokens"]), time.monotonic() - started


def answers(port: int) -> bool:
    """Whether anything answers an OpenAI-compatible ``/v1/models`` on ``port``.

    :func:`tests.fixtures.serving.lists_models` asks the same with httpx; this check runs on the GPU machine's image,
    which is only promised the standard library besides torch, transformers and peft.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
            return True
    except (urllib.error.URLError, OSError):
        return False


def serve_adapter(
    job: Path, env: dict[str, str], limit_s: float, backend: str = "vllm", extra: dict[str, str] | None = None
) -> ServeRow:
    """Serves the trained ``job``'s adapter with ``backend``, asks it twice, stops it; returns the verdict.

    ``extra`` are further serve-job keys (``converters`` for llama.cpp's, which the tests use to prove this pass).
    """
    out = job.parent / "out"
    serve_job = write_serve_job(out, limit_s, backend, extra or {})
    log = job.parent / "serve-wrapper.log"
    started = time.monotonic()
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainer_payload", "serve", str(job), str(serve_job)],
            env=env,
            cwd=job.parent,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        return _measure(out, process, started, limit_s, backend)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _measure(out: Path, process: subprocess.Popen[bytes], started: float, limit_s: float, backend: str) -> ServeRow:
    state = wait_for(out, {ServePhase.SERVING, ServePhase.ENDED}, limit_s)
    if state is None or state.phase is not ServePhase.SERVING:
        return ServeRow(f"failed: it never served ({state.reason if state else 'no serve state written'})")
    if state.backend != backend:
        return ServeRow(f"failed: served with {state.backend}, not {backend}")
    ready_s = round(time.monotonic() - started, 1)
    ask(state.port, 16)  # the first request pays for the LoRA's loading
    tokens, seconds = ask(state.port, MEASURED_TOKENS)
    counted = wait_for_requests(out, 2, 30.0)
    process.send_signal(signal.SIGTERM)
    ended = wait_for(out, {ServePhase.ENDED}, 60.0)
    process.wait(60)
    row = ServeRow("", ready_s, round(tokens / seconds, 1), counted, f"{tokens} tokens in {seconds:.1f} s")
    if counted != 2:
        row.status = f"failed: {counted} requests counted, 2 made"
    elif ended is None or ended.phase is not ServePhase.ENDED or answers(state.port):
        row.status = "failed: the server went on after Stop"
    else:
        row.status = f"ok: served '{SERVED_NAME}' with {backend}, counted both requests, ended on Stop ({ended.reason})"
    return row


def wait_for_requests(out: Path, wanted: int, limit_s: float) -> int:
    """The requests the serve state counts once it counts ``wanted`` (or when ``limit_s`` passes)."""
    deadline = time.monotonic() + limit_s
    state = read_state(out)
    while time.monotonic() < deadline and (state is None or state.requests < wanted):
        time.sleep(0.5)
        state = read_state(out)
    return state.requests if state else 0


def render_serve(row: ServeRow | None) -> list[str]:
    """The serving section of the report."""
    lines = ["## Serving on the machine: vLLM with the adapter as a LoRA module", ""]
    if row is None:
        return [*lines, "not run", ""]
    if row.ready_s is None:
        return [*lines, row.status, ""]
    lines += ["| status | ready after | tokens/s (one answer) | requests counted | detail |", "|---|---|---|---|---|"]
    lines.append(f"| {row.status} | {row.ready_s} s | {row.tokens_per_s} | {row.requests} | {row.detail} |")
    return [*lines, ""]
