"""The app's log: a rotating file in the log directory, with every secret redacted before it is written.

:func:`redact_known` is the one place secrets are taken out of text: the log's formatter, the run database's errors
and notes, the run manager's events, the CLI's error lines and the UI's error dialogs all pass it.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path

from desktop.core.redaction import redact, secret_variable_values
from desktop.services.platform.paths import app_paths

LOG_FILE_NAME = "rentune.log"
_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

# Exact secret values seen by this process (filled by the secret store), masked in every log record.
_known_secrets: set[str] = set()


def remember_secret(value: str) -> None:
    """Registers a secret value so that it is masked wherever it would appear in a log."""
    if value:
        _known_secrets.add(value)


def redact_known(text: str) -> str:
    """Masks every known secret in ``text``: the one redaction for logs, the run database, the UI and the CLI.

    Known secrets are the values registered with :func:`remember_secret` (keys read from the keyring or the
    environment, run keys) and the values of the secret environment variables set now (``*_API_KEY``, ``*_TOKEN``,
    ``*_KEY_ID``, ``*SECRET*``), even ones Rentune never read; well-known token formats are masked too.
    """
    return redact(text, _known_secrets | secret_variable_values(os.environ))


class RedactingFormatter(logging.Formatter):
    """A formatter that redacts the fully formatted record, tracebacks included."""

    def format(self, record: logging.LogRecord) -> str:
        """Formats the record as usual, then masks secrets in the result."""
        return redact_known(super().format(record))


def configure_logging(level: str = "INFO", *, to_stderr: bool = False) -> Path:
    """Sends Rentune's logs to a rotating file (and optionally stderr), redacted.

    Calling it again replaces the handlers it installed before, so it is safe to call once per entry point.

    Args:
        level: The minimum level written.
        to_stderr: Also print records to standard error (used by the CLI's ``--verbose``).

    Returns:
        The path of the log file.
    """
    log_dir = app_paths().log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / LOG_FILE_NAME
    handlers: list[logging.Handler] = [
        logging.handlers.RotatingFileHandler(log_file, maxBytes=5_000_000, backupCount=3, encoding="utf-8")
    ]
    if to_stderr:
        handlers.append(logging.StreamHandler())
    close_logging()
    root = logging.getLogger("rentune")
    for handler in handlers:
        handler.setFormatter(RedactingFormatter(_FORMAT))
        handler._rentune = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    return log_file


def close_logging() -> None:
    """Removes and closes the handlers :func:`configure_logging` installed."""
    root = logging.getLogger("rentune")
    for handler in [h for h in root.handlers if getattr(h, "_rentune", False)]:
        root.removeHandler(handler)
        handler.close()


def get_logger(name: str) -> logging.Logger:
    """Returns a logger below the ``rentune`` hierarchy, e.g. ``get_logger("ssh")``."""
    return logging.getLogger(f"rentune.{name}")
