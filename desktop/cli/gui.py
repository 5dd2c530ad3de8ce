"""``rentune`` and ``rentune gui``: open the desktop app (Qt is imported only here, and only when it runs)."""

from __future__ import annotations

import argparse

from desktop.cli.errors import CliError
from desktop.core.settings import Theme


def run_gui_command(args: argparse.Namespace) -> int:
    """Opens the desktop app (or renders one page with ``--screenshot``)."""
    from desktop.ui.app import GuiOptions, GuiStartError, run_gui  # Qt loads only when the GUI is wanted.

    options = GuiOptions(
        screenshot=args.screenshot,
        page=args.page,
        size=args.size,
        scale=args.scale,
        startup_probe=args.startup_probe,
        theme=Theme(args.theme) if args.theme else None,
        minimized=args.minimized,
    )
    try:
        return run_gui(options)
    except GuiStartError as exc:
        raise CliError(str(exc)) from exc
