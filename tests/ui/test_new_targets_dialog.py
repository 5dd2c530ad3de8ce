"""Moving a run on several machines to a fresh set of servers in the app: one per line, the head first, checked
before the dialog closes."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QDialog
from pytestqt.qtbot import QtBot

from desktop.core.runs.spec import SshTarget
from desktop.ui.widgets.dialogs import NewTargetsDialog

CURRENT = [
    SshTarget("me", "10.0.0.1", 22, Path("/keys/lab"), "python3.11", "/scratch/runs"),
    SshTarget("me", "10.0.0.2", 2222, Path("/keys/lab"), "python3.11", "/scratch/runs"),
]


def test_the_dialog_starts_from_the_runs_servers_and_refuses_a_wrong_count(qtbot: QtBot) -> None:
    dialog = NewTargetsDialog(None, CURRENT)
    qtbot.addWidget(dialog)
    assert dialog.hosts_edit.toPlainText() == "me@10.0.0.1:22\nme@10.0.0.2:2222"
    assert (dialog.key_edit.text(), dialog.python_edit.text()) == ("/keys/lab", "python3.11")
    dialog.hosts_edit.setPlainText("me@gpu-a:22")
    dialog.on_ok()
    assert dialog.result() != QDialog.DialogCode.Accepted.value
    assert dialog.problem_label.text() == (
        "The run trains on 2 machines: give one server per line (1 given), the head first."
    )


def test_one_server_per_machine_is_accepted_with_the_key_and_interpreter_entered(qtbot: QtBot) -> None:
    dialog = NewTargetsDialog(None, CURRENT)
    qtbot.addWidget(dialog)
    dialog.hosts_edit.setPlainText("me@gpu-a:22\nme@gpu-b:22")
    dialog.python_edit.setText("/opt/py/bin/python")
    dialog.on_ok()
    assert dialog.result() == QDialog.DialogCode.Accepted.value
    assert [t.url for t in dialog.chosen] == ["ssh://me@gpu-a:22", "ssh://me@gpu-b:22"]
    assert {(t.python, t.identity, t.workdir) for t in dialog.chosen} == {
        ("/opt/py/bin/python", Path("/keys/lab"), "/scratch/runs")
    }
