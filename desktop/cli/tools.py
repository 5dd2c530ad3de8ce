"""``rentune tools install|status|remove``: the local tools' private environment (merge, GGUF, MLX, chat).

``install`` makes it (or finishes an interrupted install) from a Python of the app's version, with pip's progress
as one line per step; ``status`` says what it holds and how big it is (``--json`` for scripts); ``remove`` deletes
it and says how much space that freed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.services.local.common import LocalToolError
from desktop.services.local.toolenv import ToolsState, ToolsStatus, install_tools, remove_tools, tools_status

_STATE_WORDS = {
    ToolsState.ABSENT: "not installed: rentune tools install adds them (about 1.5 GB on disk)",
    ToolsState.PARTIAL: "an install was interrupted: rentune tools install finishes it",
    ToolsState.INSTALLED: "installed",
    ToolsState.OUTDATED: "installed from an earlier Rentune's lock: rentune tools install adds what this one uses",
    ToolsState.OTHER_PYTHON: "made for another Python version: rentune tools install replaces it",
}


def gigabytes(count: int) -> str:
    """Bytes as ``1.27 GB`` (or MB below one gigabyte)."""
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"


def status_lines(status: ToolsStatus) -> list[str]:
    """What ``rentune tools status`` prints."""
    lines = [f"Local tools: {_STATE_WORDS[status.state]}", f"Folder: {status.folder}"]
    if status.state is not ToolsState.ABSENT:
        lines.append(f"Size: {gigabytes(status.size_bytes)}")
    if status.python_version:
        lines.append(f"Python: {status.python_version}")
    lines += [f"  {name} {version}" for name, version in status.packages.items()]
    return lines


def run_tools(args: argparse.Namespace) -> int:
    """Runs ``rentune tools ACTION``."""
    action = args.tools_command
    try:
        if action == "install":
            status = asyncio.run(install_tools(_say))
            print("\n".join(status_lines(status)))
        elif action == "remove":
            freed = remove_tools()
            print(f"Removed the local tools: {gigabytes(freed)} freed." if freed else "No local tools were installed.")
        elif args.json:
            status = tools_status()
            record = {"state": status.state.value, "folder": str(status.folder), "size_bytes": status.size_bytes}
            print(json.dumps(record | {"python": status.python_version, "packages": status.packages}))
        else:
            print("\n".join(status_lines(tools_status())))
    except LocalToolError as exc:
        raise CliError(str(exc), EXIT_FAILED) from None
    return EXIT_OK


def _say(text: str, fraction: float | None) -> None:
    print(f"{text}" if fraction is None else f"{text} ({fraction:.0%})", file=sys.stderr, flush=True)
