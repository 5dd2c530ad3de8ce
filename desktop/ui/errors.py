"""The app-wide exception hook: every uncaught error is logged (redacted) and shown to the user."""

from __future__ import annotations

import sys
import traceback
from types import TracebackType

from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from desktop.services.platform.logs import get_logger, redact_known

_log = get_logger("ui")


class ErrorReporter:
    """Logs uncaught exceptions and shows them in a non-blocking message box.

    ``@asyncSlot`` handlers send their failures to ``sys.excepthook``, so installing this once covers every slot.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        self._parent = parent
        self._boxes: list[QMessageBox] = []
        self.shown: list[str] = []

    def install(self) -> None:
        """Makes this reporter the process's ``sys.excepthook``."""
        sys.excepthook = self.on_exception

    def on_exception(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        """Logs the exception with its traceback and tells the user what happened."""
        if issubclass(exc_type, KeyboardInterrupt):
            QApplication.quit()
            return
        details = redact_known("".join(traceback.format_exception(exc_type, exc, tb)))
        _log.error("uncaught exception:\n%s", details)
        message = redact_known(str(exc) or exc_type.__name__)
        self.shown.append(message)
        self._show(message, details)

    def _show(self, message: str, details: str) -> None:
        if QApplication.instance() is None:
            print(details, file=sys.stderr)
            return
        box = QMessageBox(QMessageBox.Icon.Critical, "Rentune: something went wrong", message, parent=self._parent)
        box.setInformativeText("The details are in the log file (Settings shows where).")
        box.setDetailedText(details)
        box.setAccessibleName("Error message")
        box.finished.connect(lambda _result: self._boxes.remove(box))
        self._boxes.append(box)
        box.open()
