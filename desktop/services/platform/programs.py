"""Programs this computer offers the app: OpenSSH's ``sftp``, ``ssh-agent`` and ``ssh-add`` for large uploads.

Found on the ``PATH`` each time they are asked for (nothing is looked up at import time).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class OpenSshTools:
    """Paths of the OpenSSH programs an upload uses (and of ``nice``, which runs the copy behind the app)."""

    sftp: str
    agent: str
    add: str
    nice: str | None = None


def builtin_requested() -> bool:
    """Whether ``RENTUNE_TRANSFER=builtin`` asks for asyncssh to copy everything."""
    return os.environ.get("RENTUNE_TRANSFER", "").strip().lower() == "builtin"


def find_openssh() -> OpenSshTools | None:
    """OpenSSH's ``sftp``, ``ssh-agent`` and ``ssh-add``, or None where uploads use asyncssh.

    None on Windows, where any program is missing, or with ``RENTUNE_TRANSFER=builtin``.
    """
    if sys.platform == "win32" or builtin_requested():
        return None
    paths = [shutil.which(name) for name in ("sftp", "ssh-agent", "ssh-add")]
    if any(path is None for path in paths):
        return None
    sftp, agent, add = (str(path) for path in paths)
    return OpenSshTools(sftp, agent, add, shutil.which("nice"))
