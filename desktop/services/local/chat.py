"""Chatting with a local model: llama.cpp for a GGUF file (optionally with a GGUF LoRA), mlx-lm for an MLX folder.

Each engine answers with the model's own chat template. Loading and generating run on one worker thread per model
(llama.cpp and MLX state stay on the thread that made them), so the event loop never blocks; a consumer that stops
reading an answer stops its generation at the next token.

llama_cpp, mlx and mlx_lm are imported only when a model of theirs is opened.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, Protocol

from desktop.services.local.common import LocalToolError
from desktop.services.local.mlx_model import MLX_MISSING

Engine = Literal["llama.cpp", "mlx"]
#: One chat message: ``{"role": "system" | "user" | "assistant", "content": text}``.
Message = dict[str, str]

DEFAULT_CONTEXT = 4096


def generation_threads() -> int:
    """The CPU threads llama.cpp generates with: every core but one, and at least one.

    llama.cpp's threads spin while they wait for each other, so with every core taken the window's event loop,
    a run's uploads and the monitor wait for a core between tokens (stalls of 50-180 ms on two cores, against 30 ms
    with one core left free; ``python -m tests.benchmarks bench_ui``).
    """
    return max(1, (os.cpu_count() or 1) - 1)


@dataclass
class Conversation:
    """A chat's history: an optional system message and the turns so far.

    Attributes:
        system: The system message, or None.
        turns: User and assistant messages, oldest first.
    """

    system: str | None = None
    turns: list[Message] = field(default_factory=list)

    def with_question(self, question: str) -> list[Message]:
        """The messages to send for ``question``: system, history, then the question."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *self.turns, {"role": "user", "content": question}]

    def record(self, question: str, answer: str) -> None:
        """Adds a finished exchange to the history."""
        self.turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    def reset(self) -> None:
        """Forgets every turn (the system message stays)."""
        self.turns.clear()

    def take_back(self) -> str | None:
        """Removes the last exchange (to answer it again); returns its question, or None when there is none."""
        if len(self.turns) < 2:
            return None
        question = self.turns[-2]["content"]
        del self.turns[-2:]
        return question


# -- GGUF headers: what a file is, read from its first key/value pairs -------------------------------------------

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _read(stream: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    data = stream.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack("<" + fmt, data)[0]


def _read_value(stream: BinaryIO, kind: int) -> Any:
    if kind == _GGUF_STRING:
        return stream.read(_read(stream, "Q")).decode("utf-8", errors="replace")
    if kind == _GGUF_ARRAY:
        item_kind, count = _read(stream, "I"), _read(stream, "Q")
        return [_read_value(stream, item_kind) for _ in range(count)]
    if kind not in _GGUF_SCALARS:
        raise ValueError(f"unknown GGUF value type {kind}")
    return _read(stream, _GGUF_SCALARS[kind])


def gguf_kind(path: Path) -> tuple[str, str]:
    """A GGUF file's ``general.type`` ("model" when unset, "adapter" for a LoRA) and ``general.architecture``.

    Raises:
        LocalToolError: The file is not a GGUF file (wrong magic) or its header is cut short.
    """
    found = gguf_metadata(path)
    return str(found.get("general.type", "model")), str(found.get("general.architecture", "unknown"))


def gguf_context_length(path: Path) -> int | None:
    """The context length the model in a GGUF file was trained with, when its header says."""
    found = gguf_metadata(path)
    value = found.get(f"{found.get('general.architecture')}.context_length")
    return value if isinstance(value, int) and value > 0 else None


def gguf_metadata(path: Path) -> dict[str, object]:
    """The model-level metadata of a GGUF file (``general.*`` and the architecture's keys; the tokenizer's are skipped).

    Raises:
        LocalToolError: The file is not a GGUF file (wrong magic) or its header is cut short.
    """
    with path.open("rb") as stream:
        if stream.read(4) != b"GGUF":
            raise LocalToolError(f"{path} is not a GGUF file; pass a .gguf model (rentune export --gguf Q4_K_M)")
        found: dict[str, object] = {}
        try:
            _read(stream, "I")  # version
            _read(stream, "Q")  # tensor count
            for _ in range(_read(stream, "Q")):
                key = _read_value(stream, _GGUF_STRING)
                if str(key).startswith("tokenizer."):
                    break  # converters write general.* and the architecture's keys first, the large vocabulary last
                found[str(key)] = _read_value(stream, _read(stream, "I"))
        except (EOFError, ValueError, MemoryError) as exc:
            raise LocalToolError(f"{path} is a damaged GGUF file (its header is cut short); export it again") from exc
    return found


# -- engines ----------------------------------------------------------------------------------------------------------


class _Engine(Protocol):
    def generate(self, messages: list[Message], temperature: float, max_tokens: int) -> Iterator[str]: ...

    def close(self) -> None: ...


class _LlamaCppEngine:
    """llama-cpp-python's ``Llama`` with the GGUF's own chat template."""

    def __init__(self, model: Path, lora: Path | None, n_ctx: int) -> None:
        from llama_cpp import Llama

        try:
            self._llama = Llama(
                model_path=str(model),
                n_ctx=n_ctx,
                lora_path=str(lora) if lora else None,
                n_threads=generation_threads(),
                n_threads_batch=generation_threads(),
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            what = f"{model} with the LoRA {lora}" if lora else str(model)
            raise LocalToolError(f"llama.cpp could not load {what} ({exc}); check the files match each other") from exc

    def generate(self, messages: list[Message], temperature: float, max_tokens: int) -> Iterator[str]:
        greedy: dict[str, Any] = {"top_k": 1} if temperature <= 0 else {}
        chunks = self._llama.create_chat_completion(
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            temperature=max(temperature, 0.0),
            max_tokens=max_tokens,
            **greedy,
        )
        for chunk in chunks:
            text = chunk["choices"][0]["delta"].get("content")  # type: ignore[index, union-attr]
            if isinstance(text, str) and text:
                yield text

    def close(self) -> None:
        self._llama.close()


class _MlxEngine:
    """mlx-lm's ``load`` and ``stream_generate`` with the tokenizer's chat template."""

    def __init__(self, folder: Path) -> None:
        try:
            import mlx.core  # noqa: F401 - plain `mlx` on Linux imports mlx_lm but fails here (no libmlx.so)
            from mlx_lm import load
        except (ImportError, OSError) as exc:
            raise LocalToolError(MLX_MISSING) from exc
        try:
            self._model, self._tokenizer = load(str(folder))[:2]
        except (ValueError, OSError, KeyError) as exc:
            raise LocalToolError(f"mlx-lm could not load {folder} ({exc}); write it with rentune export --mlx") from exc

    def generate(self, messages: list[Message], temperature: float, max_tokens: int) -> Iterator[str]:
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler

        prompt = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True)  # type: ignore[no-untyped-call]
        sampler = make_sampler(temp=max(temperature, 0.0))
        for response in stream_generate(self._model, self._tokenizer, prompt, max_tokens=max_tokens, sampler=sampler):
            if response.text:
                yield response.text

    def close(self) -> None:
        """Frees the model and this thread's MLX streams (on the thread that generated).

        MLX needs ``clear_streams()`` at the end of every thread that used it: without it, the process aborted at
        exit now and then ("terminate called without an active exception", ml-explore/mlx#3126 and #4327).
        """
        import mlx.core as mx

        del self._model, self._tokenizer
        mx.synchronize()
        mx.clear_streams()


def choose_engine(model: Path, engine: str | None, lora: Path | None) -> Engine:
    """The engine for ``model``, after checking the files fit it.

    Args:
        model: A .gguf file (llama.cpp) or an MLX model folder (mlx).
        engine: "llama.cpp", "mlx", or None to follow from ``model``.
        lora: A GGUF LoRA for llama.cpp, or None.

    Raises:
        LocalToolError: A file is missing, is not what it should be, or does not fit the engine.
    """
    if not model.exists():
        raise LocalToolError(f"{model} does not exist; pass a .gguf file or an MLX model folder")
    chosen: Engine = engine or ("mlx" if model.is_dir() else "llama.cpp")  # type: ignore[assignment]
    if chosen == "mlx":
        _check_mlx(model, lora)
    else:
        _check_gguf(model, lora)
    return chosen


def _check_mlx(model: Path, lora: Path | None) -> None:
    if model.is_file():
        raise LocalToolError(f"{model} is a file; --engine mlx needs an MLX model folder (rentune export --mlx)")
    if not (model / "config.json").is_file():
        raise LocalToolError(f"{model} has no config.json; pass an MLX model folder (rentune export --mlx)")
    if lora is not None:
        raise LocalToolError("--lora applies a GGUF LoRA with llama.cpp; for MLX, chat with the merged MLX folder")


def _check_gguf(model: Path, lora: Path | None) -> None:
    if model.is_dir():
        raise LocalToolError(f"{model} is a folder; llama.cpp needs a .gguf file (or use --engine mlx)")
    kind, architecture = gguf_kind(model)
    if kind == "adapter":
        raise LocalToolError(f"{model} is a GGUF LoRA; pass the base model's GGUF as MODEL and this file as --lora")
    if lora is None:
        return
    if not lora.is_file():
        raise LocalToolError(f"{lora} does not exist; pass a GGUF LoRA (rentune export --lora-gguf)")
    lora_kind, lora_architecture = gguf_kind(lora)
    if lora_kind != "adapter":
        raise LocalToolError(f"{lora} is a GGUF model, not a GGUF LoRA; write one with rentune export --lora-gguf")
    if lora_architecture != architecture:
        raise LocalToolError(
            f"{lora} is a LoRA for {lora_architecture}, but {model} is {architecture}; use the LoRA's own base GGUF"
        )


class ChatModel:
    """An open model that answers chats; close it when done.

    Generation runs on the model's own worker thread; only one answer is generated at a time.
    """

    def __init__(self, engine: _Engine, worker: ThreadPoolExecutor, kind: Engine) -> None:
        self._engine = engine
        self._worker = worker
        self.engine: Engine = kind

    async def stream(
        self, messages: list[Message], *, temperature: float = 0.7, max_tokens: int = 512
    ) -> AsyncIterator[str]:
        """Yields the answer to ``messages`` in pieces as they are generated.

        Stopping the iteration (break, cancel, ``aclose``) stops the generation at its next token.

        Args:
            messages: The conversation, ending with the user's message.
            temperature: 0 answers greedily (the same answer every time).
            max_tokens: Longest answer in tokens.
        """
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | _End] = asyncio.Queue()
        generation = _Generation(self._engine, (messages, temperature, max_tokens), loop, pieces)
        loop.run_in_executor(self._worker, generation.run)
        try:
            while True:
                piece = await pieces.get()
                if isinstance(piece, _End):
                    break
                yield piece
        finally:
            generation.stop.set()
        if piece.error is not None:
            raise piece.error

    async def answer(self, messages: list[Message], *, temperature: float = 0.7, max_tokens: int = 512) -> str:
        """The whole answer to ``messages`` (see :meth:`stream`)."""
        return "".join([p async for p in self.stream(messages, temperature=temperature, max_tokens=max_tokens)])

    async def close(self) -> None:
        """Frees the model once any answer in progress has stopped."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._worker, self._engine.close)
        self._worker.shutdown(wait=False)


@dataclass(frozen=True)
class _End:
    error: BaseException | None = None


@dataclass
class _Generation:
    """One answer being generated on the worker thread into ``pieces``, until done or ``stop`` is set."""

    engine: _Engine
    request: tuple[list[Message], float, int]
    loop: asyncio.AbstractEventLoop
    pieces: asyncio.Queue[str | _End]
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Generates (on the worker thread), handing each piece and then the end to the event loop."""
        end = _End()
        try:
            for piece in self.engine.generate(*self.request):
                if self.stop.is_set():
                    break
                self.loop.call_soon_threadsafe(self.pieces.put_nowait, piece)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            end = _End(LocalToolError(f"generating failed: {exc}"))
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.pieces.put_nowait, end)


async def open_chat(
    model: Path, *, engine: str | None = None, lora: Path | None = None, n_ctx: int = DEFAULT_CONTEXT
) -> ChatModel:
    """Loads ``model`` for chatting, off the event loop.

    Args:
        model: A .gguf file (llama.cpp) or an MLX model folder (mlx).
        engine: "llama.cpp", "mlx", or None to follow from ``model``.
        lora: A GGUF LoRA to apply over a GGUF model (llama.cpp only).
        n_ctx: The context length in tokens (llama.cpp).

    Raises:
        LocalToolError: The files are missing, wrong for the engine, or do not load.
    """
    kind = choose_engine(model, engine, lora)
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rentune-chat")

    def load() -> _Engine:
        if kind == "mlx":
            return _MlxEngine(model)
        trained = gguf_context_length(model)  # a longer context than trained only costs memory and draws a warning
        return _LlamaCppEngine(model, lora, min(n_ctx, trained) if trained else n_ctx)

    try:
        loaded = await asyncio.get_running_loop().run_in_executor(worker, load)
    except BaseException:
        worker.shutdown(wait=False)
        raise
    return ChatModel(loaded, worker, kind)
