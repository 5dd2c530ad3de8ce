"""The runs list on a real RunStore: rows, opening a run, and deleting the files of ended runs only."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from desktop.core.runs.states import RunState
from desktop.core.settings import Settings
from desktop.core.storage import StorageSettings
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.spend import run_spend
from desktop.services.machines.keys import create_run_key, load_run_key
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.engine import DRIVER_LOCK_NAME
from desktop.services.runs.snapshot import footprint
from desktop.services.runs.store import RunStore, UnknownRunError
from desktop.ui.context import AppContext
from desktop.ui.cost_words import money
from desktop.ui.pages import runs_page
from desktop.ui.pages.runs_page import RunsPage, delete_question
from desktop.ui.widgets.badge_delegate import SEVERITY_ROLE, BadgeDelegate
from desktop.ui.widgets.dialogs import ConfirmDialog
from tests.fixtures.recorded_run import record_live_rented_run
from tests.fixtures.s3_server import S3Server

FLOW = [RunState.CONNECTING, RunState.UPLOADING, RunState.BOOTSTRAPPING, RunState.TRAINING]


@pytest.fixture
def context(qloop: asyncio.AbstractEventLoop) -> Iterator[AppContext]:
    ctx = AppContext(Settings(), SecretStore())
    yield ctx
    qloop.run_until_complete(ctx.manager.close())


@pytest.fixture
def page(qtbot: QtBot, context: AppContext, wait_for: Callable[..., None]) -> Iterator[RunsPage]:
    widget = RunsPage(context)
    qtbot.addWidget(widget)
    widget.resize(1080, 600)
    widget.show()
    qtbot.waitExposed(widget)
    wait_for(lambda: not widget._loading)
    yield widget
    widget.hide()


def make_run(store: RunStore, states: list[RunState], model: str = "tiny-llama", rate: float = 0.0) -> str:
    spec = {"base_model": model, "training": {"method": "qlora"}, "hourly_rate_usd": rate}
    run_id = store.create(spec, "ssh://me@127.0.0.1:2222").id
    for state in states:
        store.transition(run_id, state)
    return run_id


def reload(page: RunsPage, qloop: asyncio.AbstractEventLoop) -> None:
    qloop.run_until_complete(page.load())


def with_checkpoint(store: RunStore, run_id: str) -> Path:
    checkpoint = store.folder(run_id) / "checkpoints" / "checkpoint-20"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
    return store.runs_dir / run_id


def test_no_runs_says_what_will_appear_and_leads_to_the_wizard(page: RunsPage, qtbot: QtBot) -> None:
    assert page.views.currentWidget() is page.empty_state
    assert page.empty_state.accessibleName() == "No runs yet"
    words = " ".join(label.text() for label in page.empty_state.findChildren(QLabel))
    assert "appears here" in words and "what it cost" in words
    assert page.new_button.property("role") == "primary"
    with qtbot.waitSignal(page.sig_new_run):
        page.new_button.click()


def test_every_run_is_listed_newest_first(
    page: RunsPage, context: AppContext, qloop: asyncio.AbstractEventLoop
) -> None:
    old = make_run(context.store, [*FLOW, RunState.SYNCING, RunState.PULLING, RunState.FINISHED], "org/old", 2.0)
    live = make_run(context.store, FLOW, "org/live", 0.0)
    reload(page, qloop)
    assert page.views.currentIndex() == 1
    table = page.table
    assert table.rowCount() == 2
    columns = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert columns == ["Run", "State", "Model", "Method", "Started", "Duration", "Cost"]
    rows = [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(2)]
    assert [row[:4] for row in rows] == [[live, "Training", "org/live", "QLoRA"], [old, "Finished", "org/old", "QLoRA"]]
    assert rows[0][6] == "—", "no hourly rate: no cost"
    assert rows[1][6] == "$0.00"
    assert rows[1][5].endswith(" s")
    severities = [table.item(r, 1).data(SEVERITY_ROLE) for r in range(2)]
    assert severities == ["info", "success"], "states are coloured badges (their words say it too)"
    assert isinstance(table.itemDelegateForColumn(1), BadgeDelegate)


def test_a_run_launched_while_another_is_selected_becomes_the_selection(
    page: RunsPage, context: AppContext, qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    older = make_run(context.store, [*FLOW, RunState.SYNCING, RunState.PULLING, RunState.FINISHED], "org/a", 2.0)
    make_run(context.store, [*FLOW, RunState.SYNCING, RunState.PULLING, RunState.FINISHED], "org/b", 2.0)
    reload(page, qloop)
    page.table.selectRow([row.record.id for row in page.rows].index(older))  # the user looked at an older run
    reload(page, qloop)
    assert page.selected_record() is not None and page.selected_record().id == older  # a refresh keeps it
    new = make_run(context.store, FLOW, "org/new", 0.0)  # launched from the wizard meanwhile
    reload(page, qloop)
    assert page.selected_record() is not None and page.selected_record().id == new
    with qtbot.waitSignal(page.sig_open_run) as opened:
        page.open_button.click()
    assert opened.args == [new]  # "Open in monitor" opens the new run, not the one selected before


def test_costs_come_from_the_one_count_of_spend(
    page: RunsPage, context: AppContext, qloop: asyncio.AbstractEventLoop
) -> None:
    run_id = record_live_rented_run(context.store, Ledger())
    reload(page, qloop)
    cost = page.table.item(0, 6).text()
    snapshot = page.rows[0].snapshot
    assert snapshot.spend is not None and snapshot.spend.rented
    assert cost == f"{money(run_spend(context.store, run_id, now=snapshot.now).usd)} · $0.41/h now"


def test_enter_and_double_click_open_the_run(
    page: RunsPage, context: AppContext, qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    first = make_run(context.store, FLOW)
    second = make_run(context.store, [RunState.CANCELLED])
    reload(page, qloop)
    table = page.table
    table.setFocus()
    table.setCurrentCell(1, 0)
    with qtbot.waitSignal(page.sig_open_run) as opened:
        qtbot.keyClick(table, Qt.Key.Key_Return)
    assert opened.args == [first]
    rect = table.visualRect(table.model().index(0, 0))
    with qtbot.waitSignal(page.sig_open_run) as opened:
        # Qt 6's QTest sends a double-click item views honour only after a first click, as a real one is.
        qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        qtbot.mouseDClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert opened.args == [second]


def test_delete_asks_then_removes_the_folder_and_the_record(
    page: RunsPage,
    context: AppContext,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = context.store
    keep = make_run(store, FLOW)
    gone = make_run(store, [*FLOW, RunState.FAILED])
    create_run_key(gone)
    folder = with_checkpoint(store, gone)
    reload(page, qloop)
    page.table.selectRow(0)
    assert page.selected_record() is not None and page.selected_record().id == gone  # type: ignore[union-attr]
    assert page.delete_button.isEnabled()

    questions: list[tuple[str, str]] = []
    monkeypatch.setattr(
        runs_page, "ask_delete", lambda _p, title, text, _bucket: questions.append((title, text)) or (False, False)
    )
    page.delete_button.click()
    wait_for(lambda: len(questions) == 1)
    title, text = questions[0]
    assert title == f"Delete run {gone}?"
    assert "1 checkpoint (4 KB): the run can no longer resume" in text and "cannot be undone" in text
    assert folder.is_dir() and store.get(gone).state is RunState.FAILED, "answering Keep keeps everything"

    monkeypatch.setattr(runs_page, "ask_delete", lambda *_args: (True, False))
    page.delete_button.click()
    wait_for(lambda: page.status_label.text() == f"Deleted run {gone} and its files." and page.table.rowCount() == 1)
    assert not folder.exists()
    with pytest.raises(UnknownRunError):
        store.get(gone)
    assert load_run_key(gone) is None, "the run's SSH key is forgotten too"
    assert page.table.item(0, 0).text() == keep


def test_live_runs_cannot_be_deleted(
    page: RunsPage, context: AppContext, qloop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = context.store
    paused = make_run(store, [*FLOW, RunState.PAUSED])
    live = make_run(store, FLOW)
    folder = with_checkpoint(store, live)
    reload(page, qloop)

    def never(*_args: object) -> bool:
        raise AssertionError("a live run must not even be offered for deletion")

    monkeypatch.setattr(runs_page, "ask_delete", never)
    page.table.selectRow(0)
    assert page.selected_record().id == live  # type: ignore[union-attr]
    assert not page.delete_button.isEnabled()
    assert "is training" in page.hint_label.text() and "Stop it" in page.hint_label.text()
    page.on_delete_clicked()
    assert page.status_label.text() == page.hint_label.text()
    assert folder.is_dir() and store.get(live).state is RunState.TRAINING
    page.table.selectRow(1)
    assert not page.delete_button.isEnabled()
    assert f"Run {paused} is paused and can still be resumed" in page.hint_label.text()


def test_a_failed_run_another_process_just_resumed_is_not_deleted(
    page: RunsPage,
    context: AppContext,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = context.store
    run_id = make_run(store, [*FLOW, RunState.FAILED])
    folder = with_checkpoint(store, run_id)
    other_process = filelock.FileLock(store.folder(run_id) / DRIVER_LOCK_NAME)  # `rentune resume` follows it
    other_process.acquire()
    try:
        reload(page, qloop)
        page.table.selectRow(0)
        monkeypatch.setattr(runs_page, "ask_delete", lambda *_args: (True, False))
        page.delete_button.click()
        wait_for(lambda: page.status_label.text().startswith("Not deleted:"))
        assert "already being followed" in page.status_label.text()
        assert (folder / "checkpoints" / "checkpoint-20").is_dir() and store.get(run_id)
    finally:
        other_process.release()


def test_the_adapter_a_run_paid_for_is_named_before_it_is_deleted(tmp_path: Path) -> None:
    store = RunStore()
    run_id = make_run(store, [*FLOW, RunState.SYNCING, RunState.PULLING])
    adapter = store.folder(run_id) / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 2_500_000)
    record = store.update(run_id, adapter=str(adapter))
    _title, text = delete_question(record, footprint(store, record), 1.234)
    assert "the trained adapter (2.5 MB), which cost $1.23 to train: it cannot be brought back" in text
    assert "checkpoint" not in text, "nothing is said about checkpoints the run does not have"


def test_a_stopped_run_is_resumed_from_the_list_and_opened_in_the_monitor(
    page: RunsPage,
    context: AppContext,
    qloop: asyncio.AbstractEventLoop,
    qtbot: QtBot,
) -> None:
    with socket.socket() as sock:  # nothing listens there: the resumed run tries, then pauses
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_id = context.store.create({"base_model": "m", "training": {}}, f"ssh://me@127.0.0.1:{port}").id
    for state in [*FLOW, RunState.CANCELLED]:
        context.store.transition(run_id, state)
    finished = make_run(context.store, [*FLOW, RunState.SYNCING, RunState.PULLING, RunState.FINISHED])
    reload(page, qloop)
    page.table.selectRow([row.record.id for row in page.rows].index(finished))
    assert page.resume_button.isHidden(), "a finished run has nothing to resume"
    page.table.selectRow([row.record.id for row in page.rows].index(run_id))
    assert page.resume_button.isVisibleTo(page) and page.resume_button.isEnabled()
    with qtbot.waitSignal(page.sig_open_run, timeout=10_000) as opened:
        page.resume_button.click()
    assert opened.args == [run_id]
    assert page.status_label.text().startswith(f"Resumed run {run_id}")
    assert context.manager.is_driving(run_id), "the run is followed again (the fixture stops following it)"
    assert context.store.get(run_id).state in {RunState.PAUSED, RunState.CONNECTING}


def test_a_model_folder_is_named_by_what_it_holds_with_its_whole_path_in_the_tooltip(
    page: RunsPage, context: AppContext, qloop: asyncio.AbstractEventLoop
) -> None:
    # At 1024 px the Model column showed "/home/alexandra/models/ huggingface/hub/models--…": cut before the name.
    folder = (
        "/home/alexandra/models/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/"
        "12fd25f77366fa6b3b4b768ec3050bf629380bac"
    )
    make_run(context.store, FLOW, folder)
    make_run(context.store, FLOW, "org/hub-model")
    reload(page, qloop)
    model = runs_page.COLUMNS.index("Model")
    cells = {page.table.item(r, model).text(): page.table.item(r, model).toolTip() for r in range(2)}
    assert cells == {"HuggingFaceTB/SmolLM2-135M-Instruct (local folder)": folder, "org/hub-model": ""}


def test_a_run_that_used_a_bucket_offers_to_delete_its_checkpoints_there_too(
    page: RunsPage,
    context: AppContext,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    s3_server: S3Server,
) -> None:
    store = context.store
    storage = StorageSettings(url=f"s3://{s3_server.bucket}/team", endpoint=s3_server.endpoint)
    run_id = make_run(store, [*FLOW, RunState.FINISHED])
    store.update(run_id, spec={**store.get(run_id).spec, "bucket": storage.model_dump()})
    SecretStore().set(SecretName.BUCKET_KEY_ID, s3_server.access_key)
    SecretStore().set(SecretName.BUCKET_SECRET, s3_server.secret_key)
    client, prefix = s3_server.client(), f"team/runs/{run_id}/checkpoints/checkpoint-3"
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/adapter_model.safetensors", Body=b"w" * 5000)
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/rentune_checkpoint.json", Body=b"{}")
    client.create_multipart_upload(Bucket=s3_server.bucket, Key=f"team/runs/{run_id}/checkpoints/checkpoint-6/x")
    dialog = ConfirmDialog(page, "t", "q", "&Delete run files", "&Keep", destructive=True, option="Also")
    assert dialog.option_box.isVisibleTo(dialog) and not dialog.option_box.isChecked(), "offered, never ticked"
    asked: list[str] = []
    monkeypatch.setattr(runs_page, "confirm_with_option", lambda *_a, option: asked.append(option) or (True, True))
    reload(page, qloop)
    page.table.selectRow(0)
    page.delete_button.click()
    wait_for(lambda: page.status_label.text().startswith(f"Deleted run {run_id}"), 30)
    assert asked == [f"Also delete its checkpoints in the bucket (s3://{s3_server.bucket}/team)"]
    assert page.status_label.text().endswith("Deleted its 1 checkpoint(s) in the bucket (5 KB).")
    assert client.list_objects_v2(Bucket=s3_server.bucket, Prefix="team/runs/").get("KeyCount", 0) == 0
    assert not client.list_multipart_uploads(Bucket=s3_server.bucket).get("Uploads"), "its unfinished uploads too"
