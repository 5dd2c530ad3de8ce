"""The app warns at start of machines that bill with no live run to use them, and terminates them on request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import OfferQuery, ProviderName, RentRequest
from desktop.services.providers.registry import open_provider
from desktop.ui.main_window import MainWindow
from desktop.ui.widgets import orphans_banner
from tests.fakes.http import FakeCloud

KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf2lCXjVHZmIeOaVG7CXHPBBpU1KLdmkLmNbdzN8YKc orphan"


async def _rent(label: str) -> None:
    provider = open_provider(ProviderName.RUNPOD)
    try:
        [offer, *_] = await provider.offers(OfferQuery(gpu="RTX 4090"))
        await provider.create(RentRequest(offer, KEY_LINE, label, "img"))
    finally:
        await provider.aclose()


def test_home_warns_of_orphans_and_terminates_them_after_asking(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    fake_runpod: FakeCloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", fake_runpod.serve())
    monkeypatch.setenv("RUNPOD_API_KEY", fake_runpod.valid_key)
    qloop.run_until_complete(_rent("rentune-20200101-000000-dead"))
    qloop.run_until_complete(_rent("my-own-notebook"))  # not Rentune's: never touched
    window = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    qloop.run_until_complete(window.check_orphans())
    banner = window.orphans_banner
    assert banner.isVisible()
    assert "1 rented machine that no run uses still bills $0.69/h" in banner.text.text()
    asked: list[str] = []
    monkeypatch.setattr(orphans_banner, "confirm", lambda _parent, _title, question, *_: asked.append(question) or True)
    banner.stop_button.click()
    wait_for(lambda: not banner.isVisible())
    assert asked and "Terminate them now?" in asked[0]
    by_label = {i.label: i for i in fake_runpod.instances.values()}
    assert by_label["rentune-20200101-000000-dead"].terminated is not None
    assert by_label["my-own-notebook"].terminated is None
    assert window.status_label.text() == "Terminated 1 orphaned machine."


def test_no_key_no_question_and_no_banner(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> None:
    window = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(window)
    qloop.run_until_complete(window.check_orphans())
    assert not window.orphans_banner.isVisible()


def test_machines_left_out_of_the_search_are_shown_even_without_an_orphan(qtbot: QtBot) -> None:
    from desktop.services.providers.base import Instance, InstanceState
    from desktop.services.renting.orphans import Machine, MachinesReport
    from desktop.services.runs.store import RunStore

    banner = orphans_banner.OrphansBanner(RunStore(), SecretStore())
    qtbot.addWidget(banner)
    unread = ["Vast.ai: instance 1003 (rentune-x) could not be read (bad port)"]
    banner.show_report(MachinesReport([], unread, [], [ProviderName.VAST], unread))
    assert not banner.isHidden() and banner.stop_button.isHidden()
    assert banner.text.text() == f"Left out of the search for orphans: {unread[0]}."
    orphan = Instance(ProviderName.VAST, "1002", "rentune-20200101-000000-dead", InstanceState.RUNNING, 0.4)
    banner.show_report(MachinesReport([Machine(orphan, None, True)], unread, [], [ProviderName.VAST], unread))
    assert not banner.stop_button.isHidden() and unread[0] in banner.details_label.text()
    banner.show_report(MachinesReport([], [], [], [ProviderName.VAST]))
    assert banner.isHidden()
