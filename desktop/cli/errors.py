"""The CLI's exit codes, its one error type (a problem the user can fix, printed as one line) and that line."""

from __future__ import annotations

import sys
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A problem the user can fix; printed as one line.

    Attributes:
        exit_code: 2 for bad input (the default), 1 when the command ran but could not do its job (an unreachable
            machine, a run that could not be stopped).
    """

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def about(path: Path, problem: str) -> str:
    """``problem``, led by the file's path unless the sentence already names the file."""
    return problem if path.name in problem else f"{path}: {problem}"


def redacted(message: str) -> str:
    """``message`` with every known secret masked (keys from the keyring or the environment, token formats)."""
    from desktop.services.platform.logs import redact_known  # here: `rentune --version` loads nothing more

    return redact_known(message)


def print_error(message: str) -> None:
    """Prints ``rentune: error: MESSAGE`` to standard error, every known secret masked."""
    print(f"rentune: error: {redacted(message)}", file=sys.stderr)
