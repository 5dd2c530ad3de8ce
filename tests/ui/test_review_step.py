"""The review step launches a real run against the loopback sshd through the CLI's SPEC.toml path."""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import RunDraft, TargetDraft
from desktop.core.runs.spec import run_spec_from_dict
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.services.data.prepare import prepare_dataset
from desktop.services.machines.ssh import fingerprint
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.review_step import ReviewStep
from tests.fixtures.sshd import SshHost
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU"


@pytest.fixture
def draft(ssh_host: SshHost, tiny_model: TinyModel, chat_dataset: Path, tmp_path: Path) -> RunDraft:
    """A complete draft: prepared data, the tiny model, and the sshd as the tested own server."""
    prepared = prepare_dataset(chat_dataset, tmp_path / "prepared", seq_len=128, eval_fraction=0.1)
    training = {key: value for key, value in TINY_TRAINING.items() if key != "method"}
    target = TargetDraft(
        host=ssh_host.host,
        port=ssh_host.port,
        user=ssh_host.user,
        identity=str(ssh_host.client_key),
        python=sys.executable,
        workdir=str(tmp_path / "remote"),
        authorized_keys=str(ssh_host.server.directory / "authorized_keys"),
        host_key=ssh_host.host_public_key,
        fingerprint=fingerprint(ssh_host.host_public_key),
        gpu="no GPU found (CPU only)",
    )
    return RunDraft(
        data_file=str(chat_dataset),
        train_file=str(prepared.train),
        eval_file=str(prepared.eval or ""),
        base_model=str(tiny_model.path),
        method="lora",
        training=training,
        gpu_name="RTX 4090",
        target=target,
        hourly_rate_usd=1.5,
    )


@pytest.fixture
def step(qtbot: QtBot, qloop: asyncio.AbstractEventLoop, draft: RunDraft) -> Iterator[ReviewStep]:
    widget = ReviewStep(AppContext(Settings(), SecretStore(), draft=draft))
    qtbot.addWidget(widget)
    widget.resize(1280, 800)
    widget.show()
    yield widget
    assert widget.context.manager is not None
    qloop.run_until_complete(widget.context.manager.close())


def launched_ids(step: ReviewStep) -> list[str]:
    ids: list[str] = []
    step.sig_launched.connect(ids.append)
    return ids


def test_review_shows_the_whole_run_and_edit_links(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    step.show_draft()
    wait_for(lambda: "Pick:" in step.section_labels["sizing"].text(), timeout=30)
    data = step.section_labels["data"].text()
    assert draft.train_file in data and "training" in data and "Tokens per epoch" in data
    model = step.section_labels["model"].text()
    assert draft.base_model in model and "Method: lora" in model and "LoRA r 8" in model and "40 steps" in model
    assert "RTX 4090" in step.section_labels["sizing"].text()
    assert "At your server's $1.50 per hour" in step.section_labels["sizing"].text()
    assert "Trains on 1 GPU" in step.section_labels["sizing"].text()
    target = step.section_labels["target"].text()
    assert draft.target.url in target and f"{draft.target.fingerprint} (pinned)" in target and "no GPU" in target
    edits: list[str] = []
    step.sig_edit.connect(edits.append)
    for name in ("data", "model", "sizing", "target"):
        step.edit_buttons[name].click()
    assert edits == ["data", "model", "sizing", "target"]


def test_launch_writes_spec_toml_and_records_the_run_with_the_pinned_key(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    ids = launched_ids(step)
    step.launch_button.click()
    assert not step.launch_button.isEnabled(), "disabled while launching"
    wait_for(lambda: bool(ids), timeout=30)
    assert ids[0] in step.launch_status.text()
    assert not step.launch_button.isEnabled(), "the same draft is not launched twice"
    step.draft.hourly_rate_usd = 2.0
    step.show_draft()
    assert step.launch_button.isEnabled(), "a changed draft can be launched"
    wait_for(lambda: step._task is None or step._task.done(), timeout=30)  # its refresh, inside the loop
    spec_path = step.launched_spec
    assert spec_path is not None and spec_path.parent.parent == app_paths().data_dir / "launches"
    spec = run_spec_from_dict(tomllib.loads(spec_path.read_text()), spec_path.parent, spec_path)
    assert spec.base_model == draft.base_model and str(spec.train_file) == draft.train_file
    assert spec.target is not None and spec.target.url == draft.target.url
    assert spec.hourly_rate_usd == 1.5 and spec.training["max_steps"] == 40
    assert spec.training["num_gpus"] == 1, "the GPU count picked on the Sizing step"
    record = step.context.store.get(ids[0])
    assert record.target == draft.target.url
    assert record.host_key is not None and record.host_key.split()[:2] == draft.target.host_key.split()[:2]
    assert record.fingerprint == draft.target.fingerprint
    assert record.spec["source"] == str(spec_path.resolve())
    copied = step.context.store.folder(ids[0]) / "SPEC.toml"
    assert copied.read_text() == spec_path.read_text()


def test_a_server_with_another_key_than_the_tested_one_fails_the_run(
    step: ReviewStep, draft: RunDraft, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    draft.target = draft.target.model_copy(update={"host_key": OTHER_KEY, "fingerprint": fingerprint(OTHER_KEY)})
    run_id = qloop.run_until_complete(step.launch())
    assert run_id is not None
    assert step.context.manager is not None
    record = qloop.run_until_complete(asyncio.wait_for(step.context.manager.wait(run_id), 30))
    assert record.state is RunState.FAILED and record.error is not None and "host key" in record.error


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"train_file": ""}, "Prepare the data first"),
        ({"train_file": "/nonexistent/train.jsonl"}, "does not exist"),
        ({"training": {"lora_r": 0}}, "the run is not complete: [training]"),
        ({"target": TargetDraft(host="gpu.example.com", user="me")}, "Test the connection on the Target step"),
    ],
)
def test_launch_problems_are_shown_in_words_and_nothing_is_recorded(
    step: ReviewStep, draft: RunDraft, qloop: asyncio.AbstractEventLoop, change: dict[str, object], expected: str
) -> None:
    for key, value in change.items():
        setattr(draft, key, value)
    assert qloop.run_until_complete(step.launch()) is None
    assert step.launch_status.text().startswith("Not launched:") and expected in step.launch_status.text()
    assert step.launch_button.isEnabled()
    assert step.context.store.all() == []


def test_a_spec_toml_that_cannot_be_written_launches_nothing_and_leaves_no_spec(
    step: ReviewStep, qloop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    assert qloop.run_until_complete(step.launch()) is None
    assert "SPEC.toml could not be written" in step.launch_status.text()
    assert "No space left on device" in step.launch_status.text()
    launches = app_paths().data_dir / "launches"
    assert [p for p in launches.rglob("*") if p.is_file()] == [], "no SPEC.toml that looks complete, no part file"
    assert step.context.store.all() == []
