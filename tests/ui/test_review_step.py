"""The review step: the run in words, the checks before launching (red blocks Launch until "Launch anyway"), the one
question naming what is rented and what it costs, a real launch against the loopback sshd, and Start over."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from pytestqt.qtbot import QtBot

from desktop.core.runs.draft import ComputeDraft, RunDraft, TargetDraft
from desktop.core.runs.progress import stored_estimate
from desktop.core.runs.spec import run_spec_from_dict
from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.core.sizing.report import format_hours
from desktop.services.data.prepare import prepare_dataset
from desktop.services.machines.probe import NO_GPU
from desktop.services.machines.ssh import fingerprint
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.drafts import load_draft, save_draft
from desktop.ui.context import AppContext
from desktop.ui.pages.monitor_text import estimate_text
from desktop.ui.pages.wizard import review_step
from desktop.ui.pages.wizard.review_step import ReviewStep
from desktop.ui.pages.wizard.wizard_page import WizardPage
from tests.fixtures.sshd import SshHost
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU"
Questions = list[dict[str, object]]


@pytest.fixture(autouse=True)
def roomy_laptop(monkeypatch: pytest.MonkeyPatch) -> None:
    """This computer as a 32 GiB laptop with 2 TB free: whether the merge fits here must not follow the test
    machine's free disk (a full suite once left 7 GB free, and the review then proposed the export on the machine)."""
    from desktop.core.export.on_machine import HomeRoom
    from desktop.services.runs import preflight

    monkeypatch.setattr(preflight, "home_room", lambda: HomeRoom(32 * 2**30, 2 * 10**12))


@pytest.fixture
def draft(ssh_host: SshHost, tiny_model: TinyModel, chat_dataset: Path, tmp_path: Path) -> RunDraft:
    """A complete draft: prepared data, the tiny model, and the sshd as the tested own server (CPU only)."""
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
        gpu=NO_GPU,
    )
    return RunDraft(
        data_file=str(chat_dataset),
        train_file=str(prepared.train),
        eval_file=str(prepared.eval or ""),
        base_model=str(tiny_model.path),
        method="lora",
        training=training,
        gpu_name="RTX 4090",
        renting=False,
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
    qloop.run_until_complete(widget.context.manager.close())


@pytest.fixture
def questions(monkeypatch: pytest.MonkeyPatch) -> Questions:
    """Records the confirmation's words and answers yes."""
    asked: Questions = []

    def confirm(_parent: object, title: str, summary: str, details: str, action: str, *, anyway: bool) -> bool:
        asked.append({"title": title, "summary": summary, "details": details, "action": action, "anyway": anyway})
        return True

    monkeypatch.setattr(review_step, "confirm_launch", confirm)
    return asked


def checked(step: ReviewStep, wait_for: Callable[..., None]) -> None:
    step.show_draft()
    wait_for(lambda: step.facts is not None and not step.refreshing, timeout=40)


def launched_ids(step: ReviewStep) -> list[str]:
    ids: list[str] = []
    step.sig_launched.connect(ids.append)
    return ids


def test_review_shows_the_whole_run_in_words_with_edit_links(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    checked(step, wait_for)
    data = step.section_text("data")
    assert "Rows: " in data and "for training" in data and "Tokens per epoch: " in data
    model = step.section_text("model")
    assert f"Base model: {draft.base_model}" in model and "LoRA rank 8" in model
    assert "Sequence length: 128 tokens" in model and "Length: 40 steps at most (a quick trial)" in model
    held_out = "Evaluation: the held-out rows ten times a run" if draft.eval_file else "Evaluation: none: no rows"
    assert held_out in model and "Checkpoints: every " in model
    assert "seq_len" not in model and "micro_batch" not in model, "words, not the job's keys"
    sizing = step.section_text("sizing")
    assert "Your pick: RTX 4090: fits" in sizing and "At your server's rate" in sizing and "Trains on: 1 GPU" in sizing
    compute = step.section_text("compute")
    assert draft.target.url in compute and f"{draft.target.fingerprint} (pinned)" in compute and NO_GPU in compute
    edits: list[str] = []
    step.sig_edit.connect(edits.append)
    for name in ("data", "model", "sizing", "compute"):
        step.edit_buttons[name].click()  # type: ignore[attr-defined]
    assert edits == ["data", "model", "sizing", "compute"]


def test_the_numbers_follow_the_draft_when_it_changes(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    checked(step, wait_for)
    before = step.section_text("sizing")
    draft.training = {**draft.training, "seq_len": 4096, "micro_batch": 16}
    checked(step, wait_for)
    assert "Sequence length: 4,096 tokens" in step.section_text("model")
    assert step.section_text("sizing") != before, "sized again for the new settings, never a stale plan"


def test_a_red_check_blocks_launch_until_the_user_launches_anyway(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None], questions: Questions
) -> None:
    ids = launched_ids(step)
    checked(step, wait_for)
    headlines = [row.check.headline for row in step.check_rows]
    assert "Your server has no GPU" in headlines
    assert step.checks_badge.text() == "1 red"
    assert not step.launch_button.isEnabled(), "a red item blocks Launch"
    assert step.launch_anyway_button.isVisibleTo(step.footer()) and step.launch_anyway_button.isEnabled()
    assert step.launch_anyway_button.property("role") == "destructive"
    assert step.launch_button.property("role") == "primary"
    assert "Launch anyway" in step.launch_status.text()
    step.launch_anyway_button.click()
    wait_for(lambda: bool(ids), timeout=30)
    (question,) = questions
    assert question["anyway"] is True and question["action"] == "Launch anyway"
    assert "Launching despite: Your server has no GPU." in str(question["details"])
    assert f"Start training on {draft.target.url}?" in str(question["summary"])
    assert "$1.50 per hour" in str(question["summary"])
    assert not step.launch_button.isEnabled() and not step.launch_anyway_button.isVisibleTo(step.footer())
    assert step.launched_banner.isVisibleTo(step) and ids[0] in step.launched_banner.headline_label.text()


def test_answering_no_launches_nothing(
    step: ReviewStep, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(review_step, "confirm_launch", lambda *_args, **_kwargs: False)
    checked(step, wait_for)
    step.launch_anyway_button.click()
    assert step.launch_status.text() == "Not launched: nothing was rented or started."
    assert step.context.store.all() == []


def test_launch_writes_spec_toml_and_records_the_run_with_the_pinned_key(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop
) -> None:
    ids = launched_ids(step)
    checked(step, wait_for)
    assert qloop.run_until_complete(step.launch()) is None, "red items block a plain launch"
    assert "Your server has no GPU" in step.launch_status.text()
    run_id = qloop.run_until_complete(step.launch(anyway=True))
    assert run_id is not None and ids == [run_id]
    assert not step.launch_button.isEnabled(), "the same draft is not launched twice"
    spec_path = step.launched_spec
    assert spec_path is not None and spec_path.parent.parent == app_paths().data_dir / "launches"
    spec = run_spec_from_dict(tomllib.loads(spec_path.read_text()), spec_path.parent, spec_path)
    assert spec.base_model == draft.base_model and str(spec.train_file) == draft.train_file
    assert spec.target is not None and spec.target.url == draft.target.url and spec.compute is None
    assert spec.hourly_rate_usd == 1.5 and spec.training["max_steps"] == 40
    assert spec.training["num_gpus"] == 1, "the GPU count picked on the Sizing step"
    record = step.context.store.get(run_id)
    assert record.target == draft.target.url
    assert record.host_key is not None and record.host_key.split()[:2] == draft.target.host_key.split()[:2]
    assert record.spec["source"] == str(spec_path.resolve())
    assert (step.context.store.folder(run_id) / "SPEC.toml").read_text() == spec_path.read_text()
    # the estimate the review showed is the run's: the monitor compares the run with the same numbers
    option = step.facts.sizing.option(draft.gpu_name) or step.facts.sizing.recommended
    assert record.spec["predicted"]["hours"] == round(option.hours, 4)
    assert record.spec["predicted"]["usd"] == round(option.hours * 1.5, 2)
    assert estimate_text(stored_estimate(record.spec)).startswith(f"${option.hours * 1.5:,.2f} for about ")
    draft.hourly_rate_usd = 2.0
    checked(step, wait_for)
    assert step.launch_anyway_button.isEnabled(), "a changed draft can be launched"


def test_a_server_with_another_key_than_the_tested_one_fails_the_run(
    step: ReviewStep, draft: RunDraft, qloop: asyncio.AbstractEventLoop
) -> None:
    draft.target = draft.target.model_copy(update={"host_key": OTHER_KEY, "fingerprint": fingerprint(OTHER_KEY)})
    run_id = qloop.run_until_complete(step.launch(anyway=True))
    assert run_id is not None
    record = qloop.run_until_complete(asyncio.wait_for(step.context.manager.wait(run_id), 30))
    assert record.state is RunState.FAILED and record.error is not None and "host key" in record.error


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"train_file": ""}, "The data is not prepared"),
        ({"train_file": "/nonexistent/train.jsonl"}, "does not exist"),
        ({"training": {"lora_r": 0}}, "the run is not complete: [training]"),
        ({"target": TargetDraft(host="gpu.example.com", user="me")}, "The server's connection is not tested"),
        ({"renting": True}, "No machine picked"),
    ],
)
def test_launch_problems_are_shown_in_words_and_nothing_is_recorded(
    step: ReviewStep,
    draft: RunDraft,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    change: dict[str, object],
    expected: str,
) -> None:
    for key, value in change.items():
        setattr(draft, key, value)
    checked(step, wait_for)
    assert qloop.run_until_complete(step.launch(anyway=True)) is None
    assert step.launch_status.text().startswith("Not launched:") and expected in step.launch_status.text()
    assert step.context.store.all() == []


def test_a_missing_part_cannot_be_launched_anyway(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    draft.train_file = ""
    checked(step, wait_for)
    required = [row for row in step.check_rows if row.check.required]
    assert required and required[0].check.step == "data"
    assert not step.launch_button.isEnabled() and not step.launch_anyway_button.isVisibleTo(step.footer())
    edits: list[str] = []
    step.sig_edit.connect(edits.append)
    required[0].fix_button.click()
    assert edits == ["data"]


def test_a_spec_toml_that_cannot_be_written_launches_nothing_and_leaves_no_spec(
    step: ReviewStep, qloop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    qloop.run_until_complete(step.refresh())
    monkeypatch.setattr(os, "fsync", disk_full)
    assert qloop.run_until_complete(step.launch(anyway=True)) is None
    assert "SPEC.toml could not be written" in step.launch_status.text()
    assert "No space left on device" in step.launch_status.text()
    launches = app_paths().data_dir / "launches"
    assert [p for p in launches.rglob("*") if p.is_file()] == [], "no SPEC.toml that looks complete, no part file"
    assert step.context.store.all() == []


def test_start_over_keeps_the_data_and_the_server_and_goes_to_the_data_step(
    step: ReviewStep, draft: RunDraft, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    checked(step, wait_for)
    assert not step.launched_banner.isVisibleTo(step)
    run_id = qloop.run_until_complete(step.launch(anyway=True))
    assert run_id is not None and step.start_over_button.isVisibleTo(step)
    edits: list[str] = []
    step.sig_edit.connect(edits.append)
    train, target = draft.train_file, draft.target
    step.start_over_button.click()
    assert edits == ["data"] and step.draft is draft, "the wizard's draft, reset in place"
    assert draft.train_file == train and draft.target == target and not draft.renting
    assert draft.base_model == "" and draft.gpu_name == "" and draft.budget_usd == 0
    assert not step.launched_banner.isVisibleTo(step)


def test_a_launched_draft_stays_launched_when_the_app_is_opened_again(
    step: ReviewStep,
    draft: RunDraft,
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
) -> None:
    checked(step, wait_for)
    run_id = qloop.run_until_complete(step.launch(anyway=True))
    assert run_id is not None and draft.launched and draft.launched_run == run_id
    save_draft(draft)
    reopened = ReviewStep(AppContext(Settings(), SecretStore(), draft=load_draft()))  # the app, opened again
    qtbot.addWidget(reopened)
    reopened.show()
    reopened.show_draft()
    checked(reopened, wait_for)
    assert not reopened.launch_button.isEnabled() and not reopened.launch_anyway_button.isVisible()
    assert reopened.launched_banner.isVisibleTo(reopened) and run_id in reopened.launched_banner.headline_label.text()
    reopened.draft.budget_usd = 5.0  # an edit makes it a new draft, which may be launched
    reopened.show_draft()
    checked(reopened, wait_for)
    assert not reopened.draft.launched and reopened.launch_anyway_button.isEnabled()
    assert not reopened.launched_banner.isVisibleTo(reopened)
    qloop.run_until_complete(reopened.context.manager.close())


# -- a rented pick (no provider is asked: the pick is judged again on the draft as it is) --------------------------


def rented(draft: RunDraft, **compute: object) -> None:
    pick = {
        "provider": "runpod",
        "offer_id": "NVIDIA GeForce RTX 4090|COMMUNITY|1",
        "gpu": "RTX 4090",
        "gpu_id": "NVIDIA GeForce RTX 4090",
        "vram_gb": 24.0,
        "price_per_hour": 0.44,
        "location": "community cloud (CA)",
        **compute,
    }
    draft.renting = True
    draft.compute = ComputeDraft.model_validate(pick)


def test_a_rented_pick_the_job_does_not_fit_is_red(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    rented(draft)
    draft.base_model, draft.method = "qwen2.5-7b", "full"
    checked(step, wait_for)
    red = [row.check for row in step.check_rows if row.check.severity.value == "danger"]
    assert [check.headline for check in red] == ["The job does not fit the picked machine"]
    assert "24 GiB per GPU" in red[0].details and red[0].step == "compute"
    assert not step.launch_button.isEnabled() and step.launch_anyway_button.isVisibleTo(step.footer())


def test_the_question_before_renting_names_provider_gpu_rate_total_and_budget(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, str, str, str]] = []

    def confirm(_parent: object, title: str, summary: str, details: str, action: str, *, anyway: bool) -> bool:
        asked.append((title, summary, details, action))
        return False

    monkeypatch.setattr(review_step, "confirm_launch", confirm)
    rented(draft, spot=True, price_per_hour=0.29)
    draft.base_model, draft.method, draft.budget_usd = "qwen2.5-0.5b", "qlora", 25.0
    checked(step, wait_for)
    amber = [row.check.headline for row in step.check_rows]
    assert amber == ["Spot machine: it can be taken away at any time"]
    assert step.launch_button.isEnabled() and not step.launch_anyway_button.isVisibleTo(step.footer())
    assert "Price: $0.29 per hour" in step.section_text("compute")
    step.launch_button.click()
    ((title, summary, details, action),) = asked
    pick = step.facts.pick  # type: ignore[union-attr]
    assert pick is not None and pick.total_usd is not None
    assert title == "Rent a machine and start training?" and action == "Rent and launch"
    assert "Rent 1 x RTX 4090 (24 GiB) from RunPod (spot) at $0.29 per hour" in summary
    assert f"${pick.total_usd:,.2f} in all" in summary
    assert "$25.00" in details and "terminated the moment the adapter is on this computer" in details
    assert step.context.store.all() == [], "answered no: nothing rented"
    draft.serve_after_training, draft.serve_idle_minutes = True, 15
    step.launch_button.click()
    details = asked[-1][2]
    assert "Then it serves the tuned model, at $0.29 per hour, until 15 min pass without a request" in details


def test_the_evaluation_is_said_as_the_wizard_set_it() -> None:
    from desktop.ui.pages.wizard.review_words import evaluation_words

    draft = RunDraft()
    assert evaluation_words(draft) == "none: no rows are held out on the Data step"
    draft.eval_file = "eval.jsonl"
    assert evaluation_words(draft) == "the held-out rows ten times a run"
    draft.training = {**draft.training, "eval_steps": 1}
    assert evaluation_words(draft) == "the held-out rows every 1 step"


def test_counts_of_one_are_said_in_the_singular() -> None:
    from desktop.ui.pages.wizard.review_words import model_rows

    draft = RunDraft(base_model="qwen2.5-0.5b")
    draft.training = {**draft.training, "micro_batch": 1, "grad_accum": 1, "epochs": 1}
    rows = dict(model_rows(draft))
    assert rows["Batch"] == "1 example per step, 1 step accumulated: 1 per update"  # "1 examples", "1 steps"


def test_the_machine_settings_set_on_compute_are_reviewed() -> None:
    from desktop.ui.pages.wizard.review_words import compute_rows

    draft = RunDraft(base_model="qwen2.5-0.5b")
    rented(draft)
    assert dict(compute_rows(draft, None))["Machine settings"].startswith("the provider's defaults")
    rented(draft, python="/opt/conda/bin/python", user="root", image="pytorch/pytorch:2.5.1-cuda12.4")
    settings = dict(compute_rows(draft, None))["Machine settings"]
    assert settings == "Python /opt/conda/bin/python, login user root, image pytorch/pytorch:2.5.1-cuda12.4"


def test_a_merge_too_big_for_this_computer_is_proposed_on_the_machine_with_its_minutes_and_dollars(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    from desktop.core.export.on_machine import ON_MACHINE_OUTPUTS, HomeRoom, on_machine_cost
    from desktop.services.runs import preflight

    monkeypatch.setattr(preflight, "home_room", lambda: HomeRoom(32 * 2**30, 2 * 10**12))  # a 32 GiB laptop
    rented(draft, gpu="H100 SXM", vram_gb=80.0, price_per_hour=2.99)
    draft.base_model, draft.method = "qwen2.5-72b", "qlora"
    checked(step, wait_for)
    assert step.export_card.isVisibleTo(step) and step.export_box.isChecked(), "proposed: the box is ticked"
    words = step.export_words.text()
    # memory in GiB (182 decimal GB is 169 GiB), as every memory figure is
    assert words.startswith("Proposed: Merging this 72.7 B model needs about 169 GiB of memory, and this computer has")
    assert "this computer has 32 GiB." in words
    cost = on_machine_cost(step.facts.sizing.plan.arch.total_params, ON_MACHINE_OUTPUTS, 2.99)  # type: ignore[union-attr]
    assert 30 < cost.minutes < 200 and cost.usd == round(cost.minutes / 60 * 2.99, 2)
    work, download = format_hours(cost.work_minutes / 60), format_hours(cost.download_minutes / 60)
    assert f"On the machine: about {format_hours(cost.minutes / 60)} more of paid time, ${cost.usd:,.2f} (" in words
    assert f"({work} of work there, {download} to download at " in words, "each part of the time says its unit"
    assert re.search(r"\((\d+ h )?\d+ min of work there, (\d+ h )?\d+ min to download", words), words
    question = review_step.launch_question(draft, step.facts, [])
    assert "the machine makes the merged model and a Q8_0 GGUF" in question.details
    assert draft.export_on_machine is None, "a proposal, not yet the user's choice"
    step.accept_export_proposal()
    path, spec = review_step.write_launch_spec(draft, step.facts)
    assert spec.export_on_machine == ("merged", "gguf:Q8_0") and "[export]" in path.read_text()

    step.export_box.setChecked(False)  # the user exports at home after all
    assert draft.export_on_machine == [] and not step.export_box.isChecked()
    assert "the export on the Models page may not work here" in step.export_words.text()
    assert review_step.write_launch_spec(draft, step.facts)[1].export_on_machine == ()


def test_a_model_that_merges_here_is_exported_at_home_unless_the_user_asks(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    checked(step, wait_for)
    assert step.export_card.isVisibleTo(step) and not step.export_box.isChecked()
    assert step.export_words.text().startswith("After training, export on the Models page (the merge fits")
    step.export_box.setChecked(True)
    assert draft.export_on_machine == ["merged", "gguf:Q8_0"]
    assert "your server makes the merged model" in review_step.launch_question(draft, step.facts, []).details


def test_the_launch_words_keep_to_two_lines_beside_both_buttons_in_a_1024_px_window(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    context = AppContext(Settings(), SecretStore(), draft=draft)
    review = ReviewStep(context)
    wizard = WizardPage(context, [review])
    qtbot.addWidget(wizard)
    wizard.resize(800, 600)  # the wizard's width in a 1024 px window, beside the sidebar
    wizard.show()
    try:
        checked(review, wait_for)
        assert review.launch_anyway_button.isVisible(), "a red item (the server has no GPU) offers Launch anyway"
        status = review.launch_status
        qtbot.waitUntil(lambda: status.text().startswith("Red items block Launch"))
        lines = round(status.height() / status.fontMetrics().lineSpacing())
        assert lines <= 2, f"{status.width()} px wide, {lines} lines: the words were squeezed to a word a line"
    finally:
        qloop.run_until_complete(context.manager.close())


def test_keep_serving_after_training_goes_into_the_launched_run_with_its_idle_minutes(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None], qloop: asyncio.AbstractEventLoop, qtbot: QtBot
) -> None:
    checked(step, wait_for)
    assert step.serve_box.isVisibleTo(step) and not step.serve_box.isChecked()
    assert not step.serve_idle_spin.isEnabled(), "minutes only mean something while serving is asked for"
    qtbot.mouseClick(step.serve_box, Qt.MouseButton.LeftButton, pos=QPoint(8, step.serve_box.height() // 2))
    assert step.serve_box.isChecked() and draft.serve_after_training and step.serve_idle_spin.isEnabled()
    step.serve_idle_spin.setValue(12)
    assert "keeps billing while it serves" in step.serve_words.text()
    run_id = qloop.run_until_complete(step.launch(anyway=True))
    assert run_id is not None
    spec_path = step.launched_spec
    assert spec_path is not None
    spec = run_spec_from_dict(tomllib.loads(spec_path.read_text()), spec_path.parent, spec_path)
    assert spec.serve is not None and spec.serve.idle_minutes == 12.0
    assert step.context.store.get(run_id).spec["serve"]["idle_minutes"] == 12.0, "the engine reads it from the run"


def test_judging_on_the_machine_is_offered_with_its_price_and_goes_into_the_launched_spec(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None], qtbot: QtBot
) -> None:
    checked(step, wait_for)
    assert step.judge_box.isVisibleTo(step) and step.judge_box.isEnabled() and not step.judge_box.isChecked()
    assert step.judge_box.text() == "&Judge base against tuned on the held-out rows, on the server after training"
    assert re.search(
        r"answer up to 50 held-out rows there \(at most (\d+ h )?\d+ min, \$\d+\.\d\d\)", step.judge_words.text()
    )
    assert "[judge]" not in review_step.write_launch_spec(draft, step.facts)[0].read_text(), "off unless asked"
    qtbot.mouseClick(step.judge_box, Qt.MouseButton.LeftButton, pos=QPoint(8, step.judge_box.height() // 2))
    assert step.judge_box.isChecked() and draft.judge_on_machine
    question = review_step.launch_question(draft, step.facts, [])
    assert "After training, base and tuned answer the held-out rows on your server (at most" in question.details
    _path, spec = review_step.write_launch_spec(draft, step.facts)
    assert spec.judge is not None and spec.judge.max_examples == 50 and spec.eval_file is not None


def test_judging_on_the_machine_cannot_be_chosen_without_held_out_rows(
    step: ReviewStep, draft: RunDraft, wait_for: Callable[..., None]
) -> None:
    draft.judge_on_machine = True  # chosen once, then the held-out rows went away
    draft.eval_file = ""
    checked(step, wait_for)
    assert not step.judge_box.isEnabled() and not step.judge_box.isChecked()
    assert step.judge_words.text().startswith("Needs held-out rows: the data step sets them aside")
    assert review_step.write_launch_spec(draft, step.facts)[1].judge is None
