"""What went wrong with a machine, and whether trying again can help: decided by the kind of failure, never by text.

Only the way to the machine passes: a refused, reset or timed-out connection, a dropped channel, an sshd restart, a
copy that did not verify. The engine reconnects with :class:`Backoff`. What the machine itself answers does not: a
refused login, a changed host key, and any command that ran there and exited non-zero
(:class:`~desktop.services.machines.ssh.CommandFailedError`: a work folder it cannot create, a full disk). Retrying
only bills, so the run stops at once with the machine's own words on one line and the fix.

Exceptions: :class:`PermanentError` (raised by the engine for failures it recognises itself, e.g. too little disk
space), classified by :func:`classify` together with OSError, asyncssh.Error and RemoteError.
"""

from __future__ import annotations

import asyncio
import errno
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncssh

from desktop.services.machines.ssh import (
    CommandFailedError,
    HostKeyChangedError,
    LoginRefusedError,
    RemoteError,
    one_line,
)

_WORKDIR_FIX = "set [target] workdir to a folder the login can create and write, then resume the run"
_DISK_FIX = "free space on the machine (or rent one with a larger disk), then resume the run"
_QUOTA_FIX = "the login's disk quota is used up; free space or raise the quota, then resume the run"
_ANY_FIX = "fix this on the machine (or choose another in [target]), then resume the run"
# Which fix to print after the machine's own words (the words choose the fix, never whether to retry).
_FIXES = (
    ("No space left on device", _DISK_FIX),
    ("Disk quota exceeded", _QUOTA_FIX),
    ("Read-only file system", _WORKDIR_FIX),
    ("Permission denied", _WORKDIR_FIX),
    ("Operation not permitted", _WORKDIR_FIX),
    ("Not a directory", _WORKDIR_FIX),
    ("No such file or directory", _WORKDIR_FIX),
)
_LOCAL_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# Jitter from the OS's generator: engines of many runs must not reconnect in step.
_JITTER = random.SystemRandom().uniform


class PermanentError(RuntimeError):
    """A failure no retry can fix; the message says what happened and what to do."""


#: Everything a machine (or the way to it) can raise; :func:`classify` says which of them pass.
MACHINE_ERRORS = (OSError, asyncssh.Error, asyncio.TimeoutError, RemoteError, PermanentError)


@dataclass(frozen=True)
class Verdict:
    """How to treat a failure.

    Attributes:
        permanent: True when retrying cannot help (the run stops); False when reconnecting may.
        message: One line for people: what happened (in the machine's words where it said any) and the fix.
    """

    permanent: bool
    message: str


def classify(exc: BaseException) -> Verdict:
    """Sorts a failure met while talking to a machine into one that passes and one that does not, by its kind."""
    if isinstance(exc, PermanentError | HostKeyChangedError | LoginRefusedError):
        return Verdict(True, str(exc))
    if isinstance(exc, asyncssh.PermissionDenied):
        return Verdict(True, f"the machine refused the login ({exc.reason}); check the user and the key")
    if isinstance(exc, CommandFailedError):
        return Verdict(True, command_failure(exc))
    if isinstance(exc, asyncssh.SFTPError):
        return _sftp_verdict(exc)
    if isinstance(exc, OSError) and exc.errno in _LOCAL_DISK_ERRNOS:
        return Verdict(True, f"this computer's disk is full ({exc}); free space here, then resume the run")
    return Verdict(False, _transient_text(exc))


def command_failure(exc: CommandFailedError) -> str:
    """A failed command for people, on one line: the machine's own words, then the fix they call for."""
    fix = next((fix for words, fix in _FIXES if words.lower() in exc.said.lower()), _ANY_FIX)
    return f"the machine refused: {exc.said} (exit status {exc.exit_status}) — {fix}"


def _sftp_verdict(exc: asyncssh.SFTPError) -> Verdict:
    if isinstance(exc, asyncssh.SFTPNoSpaceOnFilesystem | asyncssh.SFTPQuotaExceeded):
        return Verdict(True, f"the machine's disk is full ({exc.reason}); {_DISK_FIX}")
    if isinstance(exc, asyncssh.SFTPPermissionDenied):
        return Verdict(True, f"the machine refused a file operation ({exc.reason}); {_WORKDIR_FIX}")
    return Verdict(False, f"{type(exc).__name__}: {one_line(exc.reason)}")


def _transient_text(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "the machine did not answer in time"
    if isinstance(exc, asyncssh.Error):
        return f"{type(exc).__name__}: {one_line(exc.reason)}"
    if isinstance(exc, RemoteError):
        return one_line(str(exc))
    return f"{type(exc).__name__}: {one_line(str(exc))}" if str(exc) else type(exc).__name__


class Backoff:
    """Waits between attempts: doubling from ``first`` up to ``cap``, jittered, and only within ``grace``.

    The grace period starts at the first failure after :meth:`reset` (called whenever the machine made progress),
    so a machine that keeps failing is given up on, while one that drops now and then is always reconnected.
    """

    def __init__(
        self,
        first: float,
        grace: float,
        cap: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[float, float], float] = _JITTER,
    ) -> None:
        self.first, self.grace, self.cap = max(first, 0.05), grace, cap
        self._clock, self._jitter = clock, jitter
        self._since: float | None = None
        self._attempts = 0

    def reset(self) -> None:
        """Forgets earlier failures (the machine is working)."""
        self._since, self._attempts = None, 0

    def failing_for(self) -> float:
        """Seconds since the first failure of the current streak (0 when none)."""
        return 0.0 if self._since is None else self._clock() - self._since

    def next_delay(self) -> float | None:
        """Seconds to wait before the next attempt, or None once the grace period is spent."""
        now = self._clock()
        if self._since is None:
            self._since = now
        left = self.grace - (now - self._since)
        if left <= 0:
            return None
        base = min(self.cap, self.first * 2.0**self._attempts)
        self._attempts += 1
        return min(base * self._jitter(0.5, 1.5), self.cap, left)
