"""``python -m trainer_payload serve job.json out/serve-job.json``: the trained adapter served on the rented machine.

After the adapter is home, a run with ``[serve]`` keeps its machine and serves the model on the machine's 127.0.0.1
only; the app reaches it through a port forwarded over the run's SSH connection. With vLLM and a GPU it serves the
base model with the adapter as a named LoRA module (``--enable-lora``, ``--max-lora-rank`` from the run); without,
it merges the adapter and serves a Q8_0 GGUF with llama-cpp-python's server (llama.cpp's converter uploaded by the
app, as for the export on the machine).

This process keeps :data:`SERVE_STATE_FILE_NAME` (a :class:`ServeState`): the phase, the port, the requests answered
(counted from the server's access log) and why it ended. It ends the server after ``idle_minutes`` without a request,
on SIGTERM (the app's Stop), when the server dies, or when it does not start in time; a server never outlives it (it
reads a pipe from this process and exits when the pipe closes, even when this process is killed).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from trainer_payload.protocol import (
    ADAPTER_DIR_NAME,
    EVENTS_FILE_NAME,
    SERVE_DIR_NAME,
    SERVE_LOG_NAME,
    SERVE_STATE_FILE_NAME,
    SERVED_REQUEST,
    EventWriter,
    JobSpec,
    ServePhase,
    ServeState,
)

HOST = "127.0.0.1"
#: The LoRA ranks vLLM's ``--max-lora-rank`` accepts; the smallest at or above the run's rank is given.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
#: The server's code: the module run as its ``__main__``, ended at once when this process's pipe closes.
_LIFELINE = (
    "import os, runpy, sys, threading\n"
    "threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()\n"
    "sys.argv[0] = sys.argv[1]; del sys.argv[1]\n"
    "code = 1\n"
    "try:\n"
    "    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True); code = 0\n"
    "except SystemExit as exc:\n"
    "    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)\n"
    "except BaseException:\n"
    "    import traceback; traceback.print_exc()\n"
    "finally:\n"  # never finalise with the lifeline thread holding stdin: that hangs the interpreter's exit
    "    sys.stdout.flush(); sys.stderr.flush(); os._exit(code)\n"
)
_BACKENDS = ("auto", "vllm", "llama.cpp")
#: How many ports are tried when another program takes the chosen one before the server binds it.
PORT_TRIES = 3
#: Why a start ended when its port was taken: the next port is tried.
PORT_TAKEN = "port taken"


class StoppedWhilePreparingError(Exception):
    """SIGTERM came while the model was being prepared (nothing serves yet)."""


class ServeJobError(ValueError):
    """The serve job is malformed, or nothing on this machine can serve the model; the message says what."""


def read_serve_job(path: Path) -> dict[str, Any]:
    """The serve job: ``name``, ``idle_minutes``, ``context``, ``backend``, ``start_minutes``, ``converters``.

    Raises:
        ServeJobError: A field is missing, of the wrong type or out of range.
    """
    job = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(job, dict):
        raise ServeJobError("the serve job is not a JSON object")
    name = job.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
        raise ServeJobError(f"the served model's name {name!r} must be 1-64 letters, digits, - or _")
    for key, low, high in (("idle_minutes", 0.01, 1440.0), ("start_minutes", 0.1, 120.0), ("context", 128, 1 << 20)):
        value = job.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ServeJobError(f"{key} = {value!r} must be a number from {low} to {high}")
    if job.get("backend", "auto") not in _BACKENDS:
        raise ServeJobError(f"backend = {job.get('backend')!r} must be one of {', '.join(_BACKENDS)}")
    return job


def choose_backend(asked: str) -> str:
    """``vllm`` where vLLM is installed and a GPU answers; else ``llama.cpp`` where llama-cpp-python is.

    Raises:
        ServeJobError: Neither can run here (or the one asked for cannot).
    """
    vllm = importlib.util.find_spec("vllm") is not None and _has_gpu()
    llama = importlib.util.find_spec("llama_cpp") is not None
    if asked == "vllm" and not vllm:
        raise ServeJobError("vLLM is not installed here or no GPU answers: use an image with vLLM, or backend auto")
    if asked in ("auto", "vllm") and vllm:
        return "vllm"
    if llama:
        return "llama.cpp"
    raise ServeJobError(
        "this machine has neither vLLM (with a GPU) nor llama-cpp-python to serve the model: use an image with vLLM "
        "(vllm/vllm-openai), or serve the GGUF on your computer (Models, Serve)"
    )


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def lora_rank_for_vllm(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), VLLM_LORA_RANKS[-1])


def vllm_command(base: Path, adapter: Path, *, name: str, rank: int, context: int, port: int) -> list[str]:
    """The vLLM OpenAI server for ``base`` with ``adapter`` as the LoRA module ``name``, on 127.0.0.1:``port``."""
    return [
        "vllm.entrypoints.openai.api_server",
        "--model", str(base),
        "--enable-lora",
        "--lora-modules", f"{name}={adapter}",
        "--max-lora-rank", str(lora_rank_for_vllm(rank)),
        "--max-model-len", str(context),
        "--host", HOST,
        "--port", str(port),
    ]  # fmt: skip


def llama_cpp_command(gguf: Path, name: str, context: int, port: int) -> list[str]:
    """llama-cpp-python's OpenAI server for ``gguf`` answering as ``name``, on 127.0.0.1:``port``."""
    return [
        "llama_cpp.server",
        "--model", str(gguf),
        "--model_alias", name,
        "--n_ctx", str(context),
        "--host", HOST,
        "--port", str(port),
    ]  # fmt: skip


def _model_context(base: Path) -> int | None:
    """The model's own longest context (``max_position_embeddings``), when its config says it."""
    try:
        config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if type(value) is int and value > 0 else None


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


class StateKeeper:
    """The serve state on disk: each change rewritten whole (a reader never sees half a file)."""

    def __init__(self, path: Path, state: ServeState) -> None:
        self.path, self.state = path, state
        self._lock = threading.Lock()
        self.update()

    def update(self, **changes: Any) -> ServeState:
        """Applies ``changes`` and writes the state."""
        with self._lock:
            self.state = replace(self.state, **changes)
            partial = self.path.with_name(self.path.name + ".partial")
            partial.write_text(self.state.to_json(), encoding="utf-8")
            partial.replace(self.path)
            return self.state


class ModelServer:
    """One serving: the model made ready, the server started and watched until it is to end.

    Args:
        spec: The trained job (its base model, output folder and LoRA rank).
        job: The serve job (:func:`read_serve_job`).
        keeper: The state kept on disk.
    """

    def __init__(self, spec: JobSpec, job: dict[str, Any], keeper: StateKeeper) -> None:
        self.spec, self.job, self.keeper = spec, job, keeper
        self.out = Path(spec.output_dir)
        self.stopping = threading.Event()
        self.child: subprocess.Popen[str] | None = None
        self.last_lines: deque[str] = deque(maxlen=8)
        self.port_taken = threading.Event()  # the server could not bind its port: another program took it

    def on_sigterm(self, _signum: int, _frame: object) -> None:
        """The app's Stop: the server ends now; while the model is still being prepared, preparing ends too."""
        self.stopping.set()
        if self.child is None:
            raise StoppedWhilePreparingError

    def serve(self) -> str:
        """Serves until idle, stopped or failed; returns why it ended.

        A port is free when it is chosen and bound by the server a moment later: when another program took it in
        between (the server says its address is in use), the server starts again on another.
        """
        backend = choose_backend(str(self.job.get("backend", "auto")))
        self.keeper.update(backend=backend, detail=f"preparing the model for {backend}")
        for _ in range(PORT_TRIES):
            reason = self._serve_on(self._command(backend, free_port()), backend)
            if reason != PORT_TAKEN:
                return reason
            self.last_lines.clear()
            self.port_taken.clear()
        return f"the server found no free port in {PORT_TRIES} tries"

    def _serve_on(self, command: list[str], backend: str) -> str:
        self.keeper.update(phase=ServePhase.STARTING, detail=f"{backend} loads the model")
        with (self.out / SERVE_LOG_NAME).open("a", encoding="utf-8") as log:
            self.child = subprocess.Popen(
                [sys.executable, "-c", _LIFELINE, *command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=os.environ | {"HF_HUB_OFFLINE": "1"},
            )
            reader = threading.Thread(target=self._read_output, args=(self.child.stdout, log), daemon=True)
            reader.start()
            try:
                return self._watch()
            finally:
                self._end_child()
                reader.join(10)  # the child is gone: its output ends
                for stream in (self.child.stdin, self.child.stdout):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()

    def _command(self, backend: str, port: int) -> list[str]:
        from trainer_payload.export import base_folder

        self.keeper.update(port=port)
        name, context = str(self.job["name"]), int(self.job["context"])
        adapter = self.out / ADAPTER_DIR_NAME
        if backend == "vllm":
            base = base_folder(self.spec.base_model)
            context = min(context, _model_context(base) or context)  # vLLM refuses a window past the model's
            return vllm_command(base, adapter, name=name, rank=self.spec.lora_r, context=context, port=port)
        return llama_cpp_command(self._gguf(), name, context, port)

    def _gguf(self) -> Path:
        """The merged model as a Q8_0 GGUF under ``out/serve`` (made once; llama.cpp's server loads it)."""
        from trainer_payload.export import MachineExport

        made = self.out / SERVE_DIR_NAME / "model-Q8_0.gguf"
        if made.is_file():
            return made
        if not isinstance(self.job.get("converters"), str):
            raise ServeJobError("llama.cpp's server needs a GGUF, and the serve job names no converters to make it")
        job = {"adapter": ADAPTER_DIR_NAME, "merged": False, "gguf": ["Q8_0"], "converters": self.job["converters"]}
        keeper = self.keeper

        class ServeExport(MachineExport):
            def say(self, fraction: float, phase: str) -> None:
                keeper.update(detail=phase)

        result = ServeExport(self.spec, job, EventWriter(self.out / EVENTS_FILE_NAME), SERVE_DIR_NAME).execute()
        if "gguf:Q8_0" not in result["outputs"]:
            raise ServeJobError("; ".join(result["notes"]) or "the GGUF for llama.cpp's server was not made")
        return made

    def _read_output(self, stream: IO[str] | None, log: IO[str]) -> None:
        assert stream is not None
        for line in stream:
            log.write(line)
            log.flush()
            self.last_lines.append(line.rstrip()[-300:])
            if not self.keeper.state.ready_at and ("address already in use" in line.lower() or "errno 98" in line):
                self.port_taken.set()
            if SERVED_REQUEST.search(line):
                state = self.keeper.state
                self.keeper.update(requests=state.requests + 1, last_request_at=time.time())

    def _watch(self) -> str:
        """Until the server is to end: waits for it to answer, then for requests; returns why it ends."""
        started = time.monotonic()
        while not self.stopping.wait(1.0):
            assert self.child is not None
            if self.port_taken.is_set():
                return PORT_TAKEN
            if self.child.poll() is not None:
                said = " | ".join(self.last_lines)[-600:]
                return f"the server ended (exit {self.child.returncode}): {said or 'no output'}"
            state = self.keeper.state
            if not state.ready_at:
                if self._answers(state):
                    self.keeper.update(phase=ServePhase.SERVING, ready_at=time.time(), detail="serving")
                elif time.monotonic() - started > float(self.job["start_minutes"]) * 60:
                    return f"the server did not answer within {self.job['start_minutes']:g} min of starting"
                continue
            idle = time.time() - max(state.ready_at, state.last_request_at)
            if idle >= state.idle_minutes * 60:
                return f"no request for {state.idle_minutes:g} min"
        return "stopped"

    def _answers(self, state: ServeState) -> bool:
        """Whether our server answers on its port: an OpenAI model list (anything else there is not it)."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{state.port}/v1/models", timeout=5) as answer:
                listed = json.loads(answer.read(1 << 20)) if answer.status == 200 else None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            return False  # not up yet, or another program on the port (an SSH server answers with its banner)
        return isinstance(listed, dict) and isinstance(listed.get("data"), list)

    def _end_child(self) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run_serve(job_path: Path, serve_job_path: Path) -> int:
    """Serves the trained job ``job_path`` as ``serve_job_path`` asks; returns the exit code (0: ended as asked)."""
    spec = JobSpec.load(job_path)
    out = Path(spec.output_dir)
    keeper = StateKeeper(out / SERVE_STATE_FILE_NAME, ServeState(ServePhase.PREPARING, pid=os.getpid()))
    try:
        job = read_serve_job(serve_job_path)
        keeper.update(model=str(job["name"]), idle_minutes=float(job["idle_minutes"]))
        server = ModelServer(spec, job, keeper)
        signal.signal(signal.SIGTERM, server.on_sigterm)
        reason = server.serve()
    except StoppedWhilePreparingError:
        reason = "stopped before the server started"
    except (ServeJobError, RuntimeError, OSError, ValueError) as exc:
        keeper.update(phase=ServePhase.ENDED, reason=f"serving failed: {exc}"[:600], detail="")
        return 1
    with contextlib.suppress(OSError):
        keeper.update(phase=ServePhase.ENDED, reason=reason[:600], detail="")
    return 0
