"""Serve on the Models page, for real: llama.cpp's server for an exported GGUF, asked by the official ``openai`` client.

The GGUF is the tiny Llama taught the pattern, exported to Q8_0 (the chain of tests/local/test_gguf.py, built once per
test run), placed where an export of a finished run lies. The page starts the server, shows its address, the requests
it answered and the copyable examples, and stops it; an app that closes stops it too.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.local.inventory import exports_folder
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.services.serving.local_server import free_port
from desktop.ui.context import AppContext
from desktop.ui.pages.models_page import ModelsPage
from desktop.ui.widgets.serve_panel import ServeDialog
from tests.fixtures.exported_models import record_returned_run
from tests.local.test_gguf import Chain, chain  # noqa: F401 - the fixture, imported

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def context(qloop: asyncio.AbstractEventLoop) -> Iterator[AppContext]:
    ctx = AppContext(Settings(), SecretStore())
    yield ctx
    qloop.run_until_complete(ctx.close())


@pytest.fixture
def page(qtbot: QtBot, context: AppContext, qloop: asyncio.AbstractEventLoop, chain: Chain) -> ModelsPage:  # noqa: F811
    run_id = record_returned_run(RunStore(), chain.adapter.path, base=str(chain.adapter.base))
    exports_folder(run_id).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(chain.q8.path, exports_folder(run_id) / "model-Q8_0.gguf")
    widget = ModelsPage(context)
    qtbot.addWidget(widget)
    widget.resize(1100, 760)
    widget.show()
    qtbot.waitExposed(widget)
    qloop.run_until_complete(widget.load())
    assert widget.select(exports_folder(run_id) / "model-Q8_0.gguf")
    return widget


def _serve(page: ModelsPage, port: int, wait_for: Callable[..., None]) -> None:
    assert page.serve_button.isEnabled()
    page.serve_button.click()
    dialog = page.dialog
    assert isinstance(dialog, ServeDialog) and dialog.isVisible()
    assert dialog.port_spin.text() == "Any free port", "a free port unless one is given"
    dialog.port_spin.setValue(port)
    dialog.serve_button.click()
    assert page.task is not None and page.task_card.isVisible()
    wait_for(lambda: page.task is None, timeout=300)
    assert page.serve_card.isVisible(), page.banner.details_label.text()


def _ask(url: str, question: str) -> str:
    from openai import OpenAI

    with OpenAI(base_url=url, api_key="none", max_retries=0) as client:
        reply = client.chat.completions.create(
            model="tuned", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=24
        )
    return str(reply.choices[0].message.content)


def _run_example(command: list[str], wait_for: Callable[..., None]) -> subprocess.CompletedProcess[str]:
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(subprocess.run, command, capture_output=True, text=True, timeout=120, check=False)
        wait_for(run.done, timeout=130)
    return run.result()


def test_serve_answers_the_openai_client_counts_it_copies_the_examples_and_stops(
    page: ModelsPage,
    context: AppContext,
    wait_for: Callable[..., None],
    chain: Chain,  # noqa: F811
) -> None:
    port = free_port()
    _serve(page, port, wait_for)
    server = page.serve_card.server
    assert server is not None and server.url == f"http://127.0.0.1:{port}/v1"
    assert server.url in page.serve_card.address_label.text() and "0 requests" in page.serve_card.address_label.text()
    assert not page.serve_button.isEnabled(), "one server at a time from the page"
    assert not page.delete_button.isEnabled() or page.task is None

    question, answer = chain.adapter.pattern[0]
    with ThreadPoolExecutor(1) as pool:  # the client blocks; the page's loop keeps running meanwhile
        reply = pool.submit(_ask, server.url, question)
        wait_for(reply.done, timeout=120)
    assert reply.result().strip() == answer, "the taught answer through the page's server"
    wait_for(lambda: "1 request answered" in page.serve_card.address_label.text(), timeout=15)

    # each example, copied from the card, runs as it is and is answered
    assert "from openai import OpenAI" in page.serve_card.example_edit.toPlainText()
    page.serve_card.copy_example_button.click()
    assert "Copied the Python example" in page.serve_card.copied_label.text()
    python = _run_example([sys.executable, "-c", QGuiApplication.clipboard().text()], wait_for)
    page.serve_card.example_tabs.setCurrentIndex(1)
    page.serve_card.copy_example_button.click()
    curl = _run_example(["bash", "-c", QGuiApplication.clipboard().text()], wait_for)
    assert python.returncode == 0 and python.stdout.strip(), python.stderr[-800:]
    assert curl.returncode == 0 and json.loads(curl.stdout)["choices"][0]["message"]["content"], curl.stdout[-800:]
    wait_for(lambda: "3 requests answered" in page.serve_card.address_label.text(), timeout=15)
    page.serve_card.copy_address_button.click()
    assert QGuiApplication.clipboard().text() == server.url

    page.serve_card.stop_button.click()
    wait_for(lambda: not page.serve_card.isVisible(), timeout=30)
    assert server.process.returncode is not None and context.servers.running() == []
    assert page.banner.headline_label.text() == f"Stopped serving {server.model.name} after 3 requests."
    assert page.serve_button.isEnabled(), "the selected GGUF can be served again"


def test_a_server_that_dies_is_said_and_closing_the_app_stops_a_running_one(
    page: ModelsPage, context: AppContext, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    _serve(page, 0, wait_for)
    server = page.serve_card.server
    assert server is not None
    server.process.kill()
    wait_for(lambda: not page.serve_card.isVisible(), timeout=30)
    assert page.banner.headline_label.text() == f"The server for {server.model.name} ended (exit -9)."
    assert context.servers.running() == [] and page.serve_button.isEnabled()

    _serve(page, 0, wait_for)
    again = page.serve_card.server
    assert again is not None and again is not server
    qloop.run_until_complete(context.close())  # what the app does when its window closes
    assert again.process.returncode is not None, "no server outlives the app"


def test_a_taken_port_is_named_with_the_fix_and_nothing_keeps_running(
    page: ModelsPage, context: AppContext, wait_for: Callable[..., None]
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        page.serve_button.click()
        assert isinstance(page.dialog, ServeDialog)
        page.dialog.port_spin.setValue(port)
        page.dialog.serve_button.click()
        wait_for(lambda: page.task is None, timeout=60)
    assert page.banner.headline_label.text() == "Starting the server did not finish."
    assert page.banner.details_label.text() == f"Port {port} is in use: choose another, or Any free port."
    assert not page.serve_card.isVisible() and context.servers.running() == []
