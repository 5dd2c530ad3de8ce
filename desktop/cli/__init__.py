"""The ``rentune`` command: starts the desktop app, or drives the same services headless.

One module per command group: ``parser`` (every command's arguments), ``app`` (``main``, dispatch, the last error
guard), ``gui``, ``doctor``, ``plan``, ``data`` and ``runs``. A group's module is imported only when its command
runs, so ``rentune plan`` never loads SSH and no subcommand loads Qt.
"""

from desktop.cli.app import main

__all__ = ["main"]
