"""The one wording layer: service messages in the app's terms, never a command, a spec key or a raw API body."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox
from pytestqt.qtbot import QtBot

from desktop.core.runs.progress import RunProgress
from desktop.ui.app_words import app_message, app_sentence
from desktop.ui.pages.monitor_text import failure_notice
from desktop.ui.widgets.dialogs import ConfirmDialog, TextDialog, confirm
from desktop.ui.widgets.elided_label import ElidedLabel

READY_TIMEOUT = (
    "the RunPod machine pod-1 was not ready after 15 min (last: SSH not answering yet); it was terminated, nothing "
    "is billing. Try again, another offer, or raise [compute] ready_timeout_minutes"
)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (
            READY_TIMEOUT,
            "The RunPod machine pod-1 was not ready after 15 min (last: SSH not answering yet); it was terminated, "
            "nothing is billing. Try again, another offer.",
        ),
        (
            'GraphQL answered 400: {"errors": [{"message": "Something went wrong", "path": ["podFindAndDeploy"]}]}',
            "The provider refused the request (400).",
        ),
        ("Vast.ai failed. the Vast.ai offer 123 is gone", "Vast.ai failed. The Vast.ai offer 123 is gone."),
        ("the key was refused; run rentune keys set runpod", "The key was refused; store its key in Settings."),
        (
            "[budget] max_usd = 5 needs [budget] hourly_rate_usd",
            "The budget (Compute step) = 5 needs your server's hourly rate (Compute step).",
        ),
        ("[weird] thing is wrong", "The run's settings is wrong."),
        ("llama.cpp could not convert it", "llama.cpp could not convert it."),
    ],
)
def test_service_messages_are_said_in_the_apps_terms(raw: str, said: str) -> None:
    assert app_sentence(raw) == said
    for never in ("[compute]", "[budget]", "rentune ", "GraphQL", '{"errors"'):
        assert never not in app_sentence(raw)


def test_what_the_sentence_leaves_out_stays_for_details() -> None:
    message = app_message(READY_TIMEOUT)
    assert "ready_timeout_minutes" not in message.text and message.details == READY_TIMEOUT
    assert app_message("The machine is gone.").details == ""


def test_a_failed_runs_error_is_shown_in_the_apps_terms() -> None:
    notice = failure_notice(RunProgress(), READY_TIMEOUT)
    assert "[compute]" not in notice.details and notice.details.startswith("The RunPod machine pod-1 was not ready")


def test_a_question_is_the_apps_own_dialog_with_named_buttons_and_enter_is_the_safe_answer(qtbot: QtBot) -> None:
    answers: list[bool] = []

    def answer_with_enter() -> None:
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, ConfirmDialog) and not isinstance(dialog, QMessageBox)
        assert dialog.action_button.text() == "&Stop the run" and dialog.cancel_button.text() == "&Keep it running"
        qtbot.keyClick(dialog, Qt.Key.Key_Return)

    QTimer.singleShot(100, answer_with_enter)
    answers.append(
        confirm(None, "Stop this run?", "The trainer saves a checkpoint.", "&Stop the run", "&Keep it running")
    )  # type: ignore[arg-type]
    assert answers == [False]


def test_a_status_line_cut_short_opens_whole_on_a_click(qtbot: QtBot) -> None:
    label = ElidedLabel("Could not stop RunPod RTX 4090: " + "the provider did not answer in time; " * 8)
    qtbot.addWidget(label)
    label.resize(200, 24)
    label.show()
    qtbot.waitExposed(label)
    assert label.is_elided()
    with qtbot.waitSignal(label.sig_clicked):
        qtbot.mouseClick(label, Qt.MouseButton.LeftButton, pos=QPoint(20, 10))
    dialog = TextDialog(label, "Status", label.text())
    qtbot.addWidget(dialog)
    assert dialog.text_label.text() == label.text()


def test_an_out_of_memory_says_what_would_fit_with_the_measured_need_as_what_to_do() -> None:
    from dataclasses import replace

    from desktop.core.runs.progress import ErrorInfo

    progress = replace(RunProgress(), errors=[ErrorInfo("oom", "out of memory at micro-batch 1", "smaller settings")])
    advice = "It needed more than 24.6 GB per GPU (the plan said 10.7 GB). With that measured, it fits on L40S."
    notice = failure_notice(progress, "oom: …", advice)
    assert notice.headline == "Out of GPU memory" and notice.details.endswith(f"What to do: {advice}")
    assert "Lower the sequence length" in failure_notice(progress, "oom: …").details, "without advice: the general fix"


def test_a_finished_run_says_what_the_machine_made_or_why_it_could_not() -> None:
    from desktop.ui.pages.monitor_text import machine_export_words

    made = {"exported_on_machine": {"merged": "export/merged", "gguf:Q8_0": "export/model-Q8_0.gguf"}}
    assert machine_export_words(made) == (
        " The machine made the merged model and a Q8_0 GGUF; they came home verified and are on the Models page."
    )
    failed = machine_export_words({"export_error": "RuntimeError: out of disk"})
    assert failed.startswith(" The export on the machine failed (") and "Models page" in failed
    assert machine_export_words({}) == ""
