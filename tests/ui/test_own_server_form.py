"""Your own server on the Compute step: Test connection reaches a real server (the loopback sshd) and pins its host
key into the draft."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import RunDraft
from desktop.core.settings import Settings
from desktop.services.machines.probe import probe_host
from desktop.services.machines.ssh import Endpoint, fingerprint
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.compute_step import ComputeStep
from desktop.ui.widgets.own_server_form import OwnServerForm
from tests.fixtures.sshd import SshHost

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU"


@pytest.fixture
def compute(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> ComputeStep:
    widget = ComputeStep(AppContext(Settings(), SecretStore(), draft=RunDraft(renting=False)))
    qtbot.addWidget(widget)
    widget.show_draft()
    widget.show()
    return widget


@pytest.fixture
def step(compute: ComputeStep) -> OwnServerForm:
    assert compute.own_button.isChecked() and compute.own_form.isVisibleTo(compute)
    assert not compute.rent_panel.isVisibleTo(compute)
    return compute.own_form


def fill(step: OwnServerForm, qtbot: QtBot, host: SshHost) -> None:
    qtbot.keyClicks(step.host_edit, host.host)
    step.port_spin.setValue(host.port)
    qtbot.keyClicks(step.user_edit, host.user)
    qtbot.keyClicks(step.key_edit, str(host.client_key))
    step.python_edit.setText("python3")


def endpoint(host: SshHost) -> Endpoint:
    return Endpoint(host.host, host.port, host.user, (host.client_key,))


def test_test_connection_pins_the_key_and_reports_the_gpu(
    compute: ComputeStep,
    step: OwnServerForm,
    qtbot: QtBot,
    ssh_host: SshHost,
    wait_for: Callable[..., None],
    qloop: asyncio.AbstractEventLoop,
) -> None:
    assert step.validate() == "Enter the server's host name or address."
    fill(step, qtbot, ssh_host)
    assert step.validate() is not None and "Test connection" in (step.validate() or "")
    step.rate_spin.setValue(1.25)
    step.test_button.click()
    assert not step.test_button.isEnabled(), "disabled while the test runs"
    assert step.progress.isVisibleTo(step)
    wait_for(lambda: step.host_key != "", timeout=30)
    assert step.test_button.isEnabled() and not step.progress.isVisibleTo(step)
    expected = fingerprint(ssh_host.host_public_key)
    assert step.fingerprint_label.text() == f"{expected} (pinned)"
    reported = qloop.run_until_complete(probe_host(endpoint(ssh_host), step.host_key, "python3"))
    assert step.gpu_label.text() == reported.gpu_summary != "", "what the probe found, on any host"
    assert step.python_label.text().startswith("Python 3.")
    assert step.validate() is None and compute.validate() is None
    draft = RunDraft()
    compute.save_into(draft)
    assert not draft.renting, "the own server was chosen"
    assert draft.target.host == ssh_host.host and draft.target.port == ssh_host.port
    assert draft.target.user == ssh_host.user and draft.target.identity == str(ssh_host.client_key)
    assert draft.target.host_key.split()[:2] == ssh_host.host_public_key.split()[:2]
    assert draft.target.fingerprint == expected and draft.target.gpu == reported.gpu_summary
    assert draft.hourly_rate_usd == 1.25


def test_changing_the_host_or_port_clears_the_pinned_key(
    step: OwnServerForm, qtbot: QtBot, ssh_host: SshHost, wait_for: Callable[..., None]
) -> None:
    fill(step, qtbot, ssh_host)
    step.test_button.click()
    wait_for(lambda: step.host_key != "", timeout=30)
    step.port_spin.setValue(ssh_host.port + 1)
    assert step.host_key == "" and "test the connection again" in step.status_label.text()
    assert step.validate() is not None
    step.port_spin.setValue(ssh_host.port)
    step.test_button.click()
    wait_for(lambda: step.host_key != "", timeout=30)
    qtbot.keyClicks(step.host_edit, "x")
    assert step.host_key == "" and step.fingerprint_label.text().startswith("Not tested")


def test_a_changed_host_key_is_refused_until_forgotten(
    compute: ComputeStep, step: OwnServerForm, qtbot: QtBot, ssh_host: SshHost, wait_for: Callable[..., None]
) -> None:
    compute.draft.target = compute.draft.target.model_copy(
        update={
            "host": ssh_host.host,
            "port": ssh_host.port,
            "user": ssh_host.user,
            "identity": str(ssh_host.client_key),
            "host_key": OTHER_KEY,
            "fingerprint": fingerprint(OTHER_KEY),
        }
    )
    compute.show_draft()
    assert step.validate() is None, "a key pinned earlier counts as tested"
    step.test_button.click()
    wait_for(lambda: step.status_label.text().startswith("Connection failed"), timeout=30)
    assert "may be an attack" in step.status_label.text()
    assert step.host_key == OTHER_KEY, "a refused key never replaces the pinned one"
    step.forget_button.click()
    assert step.validate() is not None
    step.test_button.click()
    wait_for(lambda: step.host_key != "", timeout=30)
    assert step.fingerprint == fingerprint(ssh_host.host_public_key)


def test_a_refused_login_is_shown_in_words(
    step: OwnServerForm, qtbot: QtBot, ssh_host: SshHost, wait_for: Callable[..., None]
) -> None:
    fill(step, qtbot, ssh_host)
    step.user_edit.setText("nobody-here")
    step.test_button.click()
    wait_for(lambda: step.status_label.text().startswith("Connection failed"), timeout=30)
    assert "refused the login" in step.status_label.text() and str(ssh_host.client_key) in step.status_label.text()
    assert step.host_key == "" and step.validate() is not None


def test_a_server_without_that_python_cannot_be_chosen(
    step: OwnServerForm, qtbot: QtBot, ssh_host: SshHost, wait_for: Callable[..., None]
) -> None:
    fill(step, qtbot, ssh_host)
    step.python_edit.setText("/no/such/python3")
    step.test_button.click()
    wait_for(lambda: step.host_key != "", timeout=30)
    problem = step.validate()
    assert problem is not None and "no working Python" in problem
    step.python_edit.setText("python3")
    step.test_button.click()
    wait_for(lambda: step.test_button.isEnabled() and step.validate() is None, timeout=30)


def test_a_budget_on_the_own_server_needs_its_hourly_rate(
    compute: ComputeStep, step: OwnServerForm, qtbot: QtBot, ssh_host: SshHost, wait_for: Callable[..., None]
) -> None:
    fill(step, qtbot, ssh_host)
    step.test_button.click()
    wait_for(lambda: step.host_key != "", timeout=30)
    compute.budget_spin.setValue(10.0)
    problem = compute.validate()
    assert problem is not None and "hourly rate" in problem
    step.rate_spin.setValue(2.0)
    assert compute.validate() is None
    draft = RunDraft()
    compute.save_into(draft)
    spec = draft.spec_dict()
    assert "compute" not in spec and spec["target"]["ssh"] == f"ssh://{ssh_host.user}@{ssh_host.host}:{ssh_host.port}"
    assert spec["budget"] == {"hourly_rate_usd": 2.0, "max_usd": 10.0}
