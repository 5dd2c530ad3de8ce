"""Uncaught exceptions are logged (redacted) and shown, not lost."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication, QMessageBox
from pytestqt.qtbot import QtBot

from desktop.services.platform.logs import configure_logging, remember_secret
from desktop.ui.errors import ErrorReporter


def test_exception_is_logged_and_shown_without_its_secret(qtbot: QtBot) -> None:
    secret = "rk_live_" + "AAAABBBBCCCCDDDD"
    remember_secret(secret)
    log_file = configure_logging()
    reporter = ErrorReporter()
    try:
        raise ValueError(f"bad key {secret}")
    except ValueError:
        reporter.on_exception(*sys.exc_info())  # type: ignore[arg-type]
    assert reporter.shown == ["bad key ***"]
    boxes = [w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.isVisible()]
    assert boxes and boxes[0].text() == "bad key ***"
    assert secret not in boxes[0].detailedText()
    text = log_file.read_text()
    assert "ValueError: bad key ***" in text and secret not in text
    for box in boxes:
        box.close()
