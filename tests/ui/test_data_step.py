"""The wizard's data step on real files: check off the UI thread, report, histogram, preview, prepared files."""

from __future__ import annotations

import asyncio
import csv
import gc
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.settings import Settings
from desktop.services.data.workspace import CHECK_FILE, SHORT_SHA
from desktop.services.platform.files import sha256_file
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.data_step import DataStep
from desktop.ui.widgets.blocks import Badge

BAD = Path(__file__).parents[1] / "data" / "bad"


@pytest.fixture
def context() -> AppContext:
    return AppContext(Settings(), SecretStore())


@pytest.fixture
def step(qtbot: QtBot, qloop: asyncio.AbstractEventLoop, context: AppContext) -> DataStep:
    gc.collect()  # earlier tests' Qt objects must not be collected later in a worker thread (Qt warns)
    widget = DataStep(context)
    qtbot.addWidget(widget)
    widget.resize(1000, 700)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def pick(step: DataStep, qtbot: QtBot, path: Path) -> None:
    """Types the path and presses Enter, as a user would."""
    step.path_edit.setFocus()
    step.path_edit.setText(str(path))
    qtbot.keyClick(step.path_edit, Qt.Key.Key_Return)


def checked(step: DataStep, wait_for: Callable[..., None]) -> None:
    wait_for(lambda: not step.running and step.check is not None, 60)


def jsonl_rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def prepared_rows(step: DataStep) -> list[dict[str, object]]:
    """Every example in the prepared train and eval files the draft points at."""
    files = [step.draft.train_file, step.draft.eval_file]
    return [row for name in files if name for row in jsonl_rows(Path(name))]


def test_chat_dataset_is_checked_shown_and_prepared(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], chat_dataset: Path
) -> None:
    assert "Choose your dataset" in (step.validate() or "")
    pick(step, qtbot, chat_dataset)
    assert step.running
    assert "still being checked" in (step.validate() or "")
    checked(step, wait_for)
    check = step.check
    assert check is not None and check.usable
    findings = check.report["findings"]
    assert step.findings_table.rowCount() == len(findings)
    total = sum(f["count"] for f in findings)
    assert step.tabs.tabText(0) == f"Fin&dings ({len(findings)})"  # what the table lists: it counted rows
    assert step.tabs.tabToolTip(0).endswith(f"of problem, in {total} row{'s' if total != 1 else ''}")
    numbers = check.numbers
    assert numbers is not None and numbers.kept == check.kept and numbers.rows_with_errors == 0
    assert step.summary_label.text() == f"chat.jsonl: {check.kept} of 96 rows will be used"
    assert step.summary_badge.text().startswith("Ready") and step.summary_badge.property("severity") == "success"
    details = step.details_label.text()
    assert f"{numbers.train_tokens:,} tokens trained per epoch" in details
    assert "Estimated at about 4 characters per token, as no model is chosen yet" in details
    assert "(" not in details, "no parentheses in the data summary"
    # Histogram: every kept example in a bar, the sequence length marked.
    bars = step.histogram_bars.opts
    assert sum(bars["height"]) == check.kept
    assert list(bars["x0"])[-1] + list(bars["width"])[-1] > 2048  # the plotted range reaches past the line
    assert step.seq_len_line.value() == 2048
    assert "Median" in step.histogram_caption.text()
    preview = step.preview_text.toPlainText()
    assert preview.count("— Example") == 3
    assert "system: You are a helpful assistant that adds numbers." in preview
    assert "user: What is " in preview and "assistant: " in preview
    # Prepared into the workspace, named after the source and its hash; the draft points at the files.
    folder = app_paths().data_dir / "datasets" / f"chat-{sha256_file(chat_dataset)[:SHORT_SHA]}"
    draft = step.draft
    assert draft.data_file == str(chat_dataset)
    assert Path(draft.train_file) == folder / "train.jsonl"
    assert Path(draft.eval_file) == folder / "eval.jsonl"
    assert (folder / "manifest.json").is_file() and (folder / CHECK_FILE).is_file()
    kept_rows = prepared_rows(step)
    assert len(kept_rows) == check.kept
    assert all(row["messages"][-1]["role"] == "assistant" for row in kept_rows)  # type: ignore[index]
    assert step.validate() is None


def test_line_errors_are_listed_with_line_and_fix_and_the_rest_is_prepared(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    source = shutil.copy(BAD / "invalid_json.jsonl", tmp_path / "invalid_json.jsonl")
    pick(step, qtbot, Path(source))
    checked(step, wait_for)
    table = step.findings_table
    rows = {table.item(r, 1).text().splitlines()[0]: r for r in range(table.rowCount())}
    row = rows["Invalid JSON"]
    badge = table.cellWidget(row, 0).findChild(Badge)
    assert (badge.text(), badge.property("severity")) == ("Error", "danger")
    assert table.item(row, 3).text() == "3"
    assert table.item(row, 4).text() == "Fix the line's JSON or delete the line."
    assert "line 3:" in table.item(row, 1).text()
    # A file with an error gets no tick: an amber badge naming what was left out.
    assert (step.summary_badge.text(), step.summary_badge.property("severity")) == (
        "Usable · 1 row left out",
        "warning",
    )
    assert "Left out: 1 row with errors." in step.details_label.text()
    assert step.validate() is None  # the good rows are prepared; the bad line is dropped
    assert len(prepared_rows(step)) == 4


def test_a_file_without_a_usable_row_blocks_next_with_the_reason(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    bad_lines = [
        (BAD / "invalid_json.jsonl").read_text(encoding="utf-8").splitlines()[2],
        (BAD / "no_assistant.jsonl").read_text(encoding="utf-8").splitlines()[2],
    ]
    source = tmp_path / "broken.jsonl"
    source.write_text("\n".join(bad_lines) + "\n", encoding="utf-8")
    pick(step, qtbot, source)
    checked(step, wait_for)
    problem = step.step_problem()
    assert problem is not None and problem.field is step.path_edit
    assert problem.headline == "No row of broken.jsonl can be used"
    assert "fix the rows listed under Findings" in problem.details
    # What blocks Next is shown at once, as a red banner at the top of the step, with the field marked.
    assert step.problem_banner.isVisibleTo(step) and step.problem_banner.property("severity") == "danger"
    assert step.problem_banner.headline_label.text() == problem.headline
    assert step.path_edit.property("invalid") == "true"
    assert (step.summary_badge.text(), step.summary_badge.property("severity")) == ("Cannot be used", "danger")
    table = step.findings_table
    found = {
        table.item(r, 1).text().splitlines()[0]: (table.item(r, 3).text(), table.item(r, 4).text())
        for r in range(table.rowCount())
    }
    assert found["Invalid JSON"] == ("1", "Fix the line's JSON or delete the line.")
    assert found["No assistant turn"][0] == "2"
    assert "Add the answer the model should learn" in found["No assistant turn"][1]
    assert step.draft.train_file == ""
    assert not (app_paths().data_dir / "datasets").exists()


def test_missing_file_says_so(step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path) -> None:
    pick(step, qtbot, tmp_path / "nope.jsonl")
    checked(step, wait_for)
    problem = step.step_problem()
    assert problem is not None and problem.headline == "nope.jsonl does not exist"
    assert "Choose file" in problem.details and "pass the path" not in problem.text


def test_csv_input_is_checked_and_prepared_as_messages(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    source = tmp_path / "qa.csv"
    with source.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question", "answer"])
        for n in range(20):
            writer.writerow([f"What is {n} times two?", f"{n} times two is {2 * n}."])
    pick(step, qtbot, source)
    checked(step, wait_for)
    assert step.validate() is None
    assert "user: What is 0 times two?" in step.preview_text.toPlainText()
    rows = prepared_rows(step)
    assert len(rows) == 20
    assert rows[0]["messages"][-1]["role"] == "assistant"  # type: ignore[index]


def test_reopened_step_shows_the_remembered_report_without_rechecking(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], chat_dataset: Path, context: AppContext
) -> None:
    pick(step, qtbot, chat_dataset)
    checked(step, wait_for)
    first = step.check
    # A new step on the same draft (the wizard reopened): the report comes back from the workspace.
    again = DataStep(context)
    qtbot.addWidget(again)
    again.show_draft()
    checked(again, wait_for)
    assert again.check == first
    assert again.path_edit.text() == str(chat_dataset)
    assert again.findings_table.rowCount() == step.findings_table.rowCount()
    # A changed source (different size) is checked again, and prepared into a new folder.
    with chat_dataset.open("a", encoding="utf-8") as handle:
        handle.write(
            json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
            + "\n"
        )
    third = DataStep(context)
    qtbot.addWidget(third)
    third.show_draft()
    checked(third, wait_for)
    assert third.check is not None and third.check.report["rows"] == 97
    assert Path(third.draft.train_file).parent != Path(first.train_file).parent  # type: ignore[union-attr]


def test_repick_cancels_the_running_check(
    step: DataStep,
    qtbot: QtBot,
    wait_for: Callable[..., None],
    chat_dataset: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rentune")
    big = tmp_path / "big.jsonl"
    line = chat_dataset.read_text(encoding="utf-8").splitlines()[0]
    big.write_text("\n".join(line.replace("plus", f"plus {n}") for n in range(60_000)) + "\n", encoding="utf-8")
    pick(step, qtbot, big)
    wait_for(lambda: step.progress_bar.value() > 0, 60)
    first_task, first_cancel = step._task, step._cancel
    pick(step, qtbot, chat_dataset)
    assert first_cancel is not None and first_cancel.is_set()  # the worker stops at its next progress point
    wait_for(lambda: first_task is not None and first_task.done(), 10)
    assert first_task is not None and first_task.cancelled()
    checked(step, wait_for)
    assert step.check is not None and Path(step.check.source) == chat_dataset
    assert step.draft.data_file == str(chat_dataset)
    stopped = f"stopped checking {big}: cancelled"
    wait_for(lambda: stopped in caplog.messages, 30)  # the worker thread itself gave up
    prepared = [p.name for p in (app_paths().data_dir / "datasets").iterdir()]
    assert len(prepared) == 1 and prepared[0].startswith("chat-")  # the big file was never prepared


def test_fields_have_names_and_are_reachable_with_tab(step: DataStep, qtbot: QtBot) -> None:
    step.activateWindow()
    step.path_edit.setFocus()
    qtbot.waitUntil(step.path_edit.hasFocus)
    reached: list[QWidget] = []
    for _ in range(6):
        focused = QApplication.focusWidget()
        assert focused is not None
        reached.append(focused)
        qtbot.keyClick(focused, Qt.Key.Key_Tab)
    for widget in (step.path_edit, step.choose_button, step.findings_table):
        assert widget in reached
        assert widget.accessibleName()
    assert step.histogram_plot.accessibleName() and step.preview_text.accessibleName()
    assert step.progress_bar.accessibleName() and step.summary_label.accessibleName()


def test_rows_left_out_and_errors_found_are_two_counts_named_apart(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path, chat_dataset: Path
) -> None:
    source = tmp_path / "two_errors.jsonl"
    # One row with two errors (an unknown role and no assistant turn), and one with an invalid JSON line.
    bad = [
        json.dumps({"messages": [{"role": "bot", "content": "x"}, {"role": "user", "content": "y"}]}),
        "{oops",
    ]
    source.write_text(chat_dataset.read_text(encoding="utf-8") + "\n".join(bad) + "\n", encoding="utf-8")
    pick(step, qtbot, source)
    checked(step, wait_for)
    numbers = step.check.numbers if step.check else None
    assert numbers is not None and (numbers.rows_with_errors, numbers.error_problems) == (2, 3)
    details = step.details_label.text()
    assert "Left out: 2 rows with errors" in details
    assert "Those 2 rows hold 3 errors in all" in details
    assert step.summary_badge.text() == "Usable · 2 rows left out"


def test_rows_with_a_suspected_secret_can_be_left_out_and_the_prepared_data_follows(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    source = shutil.copy(BAD / "secret.jsonl", tmp_path / "secret.jsonl")
    pick(step, qtbot, Path(source))
    checked(step, wait_for)
    assert step.secrets_box.isVisibleTo(step) and step.secrets_banner.property("severity") == "warning"
    assert step.secrets_banner.headline_label.text() == "1 row seems to hold a secret: kept in the training data"
    assert step.summary_badge.property("severity") == "warning"
    assert any("hf_" in json.dumps(row) for row in prepared_rows(step))
    kept_before = step.check.kept if step.check else 0
    step.secrets_check.setFocus()
    qtbot.keyClick(step.secrets_check, Qt.Key.Key_Space)  # by keyboard
    assert step.draft.leave_out_secrets
    wait_for(lambda: not step.running and step.check is not None and step.check.leave_out_secrets, 60)
    check = step.check
    assert check is not None and check.numbers is not None and check.numbers.secrets_left_out
    assert check.kept == kept_before - 1
    assert not any("hf_" in json.dumps(row) for row in prepared_rows(step)), "the prepared files leave it out"
    assert "1 row with a suspected secret" in step.details_label.text()
    assert "left out of the training data" in step.secrets_banner.headline_label.text()
    assert "hf_" not in step.preview_text.toPlainText()


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_a_table_with_unknown_columns_is_mapped_with_the_column_boxes(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    rows = [[f"topic {n}", f"Tell me about {n}.", f"{n} is a number."] for n in range(12)]
    source = write_csv(tmp_path / "notes.csv", ["topic", "ask", "reply"], rows)
    pick(step, qtbot, source)
    checked(step, wait_for)
    problem = step.step_problem()
    box = step.mapping_box
    assert box.isVisibleTo(step) and problem is not None and problem.field is box.combos["user"]
    assert problem.headline == "Which columns of notes.csv hold the conversation?"
    assert "--columns" not in problem.text and "--columns" not in step.details_label.text()
    assert [box.combos["user"].itemText(i) for i in range(box.combos["user"].count())] == ["topic", "ask", "reply"]
    # Chosen by keyboard: the user's message, then the answer; the file is checked again with the mapping.
    user, answer = box.combos["user"], box.combos["assistant"]
    user.setFocus()
    qtbot.keyClick(user, Qt.Key.Key_Down)
    qtbot.keyClick(user, Qt.Key.Key_Down)
    assert not step.running, "half a mapping is not checked yet"
    answer.setFocus()
    for _ in range(3):
        qtbot.keyClick(answer, Qt.Key.Key_Down)
    assert step.draft.data_columns == {"user": "ask", "assistant": "reply"}
    wait_for(lambda: not step.running and step.check is not None, 60)
    assert step.validate() is None
    conversations = [row["messages"] for row in prepared_rows(step)]
    assert len(conversations) == 12
    pairs = {(m[0]["content"], m[1]["content"]) for m in conversations}  # type: ignore[index]
    assert pairs == {(f"Tell me about {n}.", f"{n} is a number.") for n in range(12)}


def test_a_guessed_column_mapping_is_shown_and_can_be_changed(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path
) -> None:
    rows = [[f"Q{n}?", f"A{n}.", f"Better answer {n}."] for n in range(15)]
    source = write_csv(tmp_path / "qa.csv", ["question", "answer", "better"], rows)
    pick(step, qtbot, source)
    checked(step, wait_for)
    box = step.mapping_box
    assert box.isVisibleTo(step) and box.mapping() == {"user": "question", "assistant": "answer"}
    assert box.combos["system"].currentText() == "(none)"
    answer = box.combos["assistant"]
    answer.setCurrentIndex(answer.findText("better"))
    answer.activated.emit(answer.currentIndex())  # what choosing it in the list does
    wait_for(lambda: not step.running and step.check is not None and step.check.columns is not None, 60)
    answers = {row["messages"][-1]["content"] for row in prepared_rows(step)}  # type: ignore[index]
    assert answers == {f"Better answer {n}." for n in range(15)}
    assert step.check is not None and step.check.numbers is not None
    assert step.check.numbers.columns == {"user": "question", "assistant": "better"}


def test_the_ready_badge_says_what_its_warnings_count(
    step: DataStep, qtbot: QtBot, wait_for: Callable[..., None], tmp_path: Path, chat_dataset: Path
) -> None:
    # "Ready · 44 warnings" counted rows under a word that counts problems; the badge names what each number counts.
    rows = chat_dataset.read_text(encoding="utf-8").splitlines()
    mail = {"messages": [{"role": "user", "content": "Mail me"}, {"role": "assistant", "content": "a@b.org"}]}
    source = tmp_path / "warned.jsonl"
    source.write_text("\n".join([*rows, *rows[:3], json.dumps(mail)]) + "\n", encoding="utf-8")
    pick(step, qtbot, source)
    checked(step, wait_for)
    # the chat dataset repeats 40 of its rows; 3 more repeats and a row with an e-mail address are added
    assert step.summary_badge.text() == "Ready · 43 repeated rows left out, 1 row with an e-mail address"
    assert step.summary_badge.property("severity") == "success"
    # a third kind of warning is counted as a kind, not run on: the badge stays short
    long_row = {"messages": [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": "w " * 10000}]}
    longer = tmp_path / "warned_more.jsonl"
    longer.write_text("\n".join([*rows, *rows[:3], json.dumps(mail), json.dumps(long_row)]) + "\n", "utf-8")
    pick(step, qtbot, longer)
    wait_for(lambda: step.check is not None and step.check.source == str(longer))
    checked(step, wait_for)
    badge = step.summary_badge.text()
    assert badge == "Ready · 43 repeated rows left out, 1 row with an e-mail address and 1 more kind", badge
    assert step.summary_badge.toolTip() == (
        "Warnings, listed under Findings: 43 repeated rows left out, 1 row with an e-mail address, 1 row too long."
    )
