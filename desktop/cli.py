"""The ``rentune`` command: starts the desktop app, or drives the same services headless.

Without a subcommand it opens the GUI. Subcommands work without a display and never import Qt.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from desktop import __version__
from trainer_payload.protocol import PROTOCOL_VERSION

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


def _size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d{3,5})x(\d{3,5})", text)
    if not match:
        raise argparse.ArgumentTypeError(f"size {text!r} must look like 1280x800")
    return int(match[1]), int(match[2])


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"scale {text!r} must be a number such as 1 or 2") from None
    if not 0.5 <= value <= 4:
        raise argparse.ArgumentTypeError(f"scale {value:g} must be between 0.5 and 4")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Returns the parser of the ``rentune`` command line."""
    parser = argparse.ArgumentParser(
        prog="rentune",
        description="Fine-tune LLMs on rented GPUs. Without a command, opens the desktop app.",
    )
    parser.add_argument(
        "--version", action="version", version=f"rentune {__version__} (payload protocol {PROTOCOL_VERSION})"
    )
    parser.add_argument("--screenshot", metavar="FILE", type=Path, help="render the window offscreen to a PNG, exit")
    parser.add_argument("--page", metavar="NAME", help="the page to open (or to render with --screenshot)")
    parser.add_argument("--size", type=_size, default=(1280, 800), help="window size, e.g. 1280x800")
    parser.add_argument("--scale", type=_scale, default=1.0, help="UI scale factor, e.g. 2 for 200%%")
    parser.add_argument("--startup-probe", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("gui", help="open the desktop app (the default)")
    doctor = commands.add_parser("doctor", help="check this computer: Python, keyring, data folder, local tools")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    return parser


def _run_gui(args: argparse.Namespace) -> int:
    from desktop.ui.app import GuiOptions, GuiStartError, run_gui  # Qt loads only when the GUI is wanted.

    options = GuiOptions(
        screenshot=args.screenshot,
        page=args.page,
        size=args.size,
        scale=args.scale,
        startup_probe=args.startup_probe,
    )
    try:
        return run_gui(options)
    except GuiStartError as exc:
        raise CliError(str(exc)) from exc


def _run_doctor(args: argparse.Namespace) -> int:
    from desktop.services.environment import check_environment

    checks = check_environment()
    if args.json:
        print(json.dumps([asdict(check) for check in checks], indent=2))
    else:
        for check in checks:
            mark = "ok " if check.ok else ("ERR" if check.required else "-- ")
            fix = f"  -> {check.fix}" if check.fix else ""
            print(f"[{mark}] {check.name:<18} {check.detail}{fix}")
    return EXIT_OK if all(check.ok for check in checks if check.required) else EXIT_FAILED


_COMMANDS: dict[str | None, Callable[[argparse.Namespace], int]] = {
    None: _run_gui,
    "gui": _run_gui,
    "doctor": _run_doctor,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``rentune`` command line.

    Args:
        argv: The arguments (without the program name); ``sys.argv[1:]`` by default.

    Returns:
        The exit code: 0 success, 1 the command ran and found problems, 2 bad input.
    """
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except CliError as exc:
        print(f"rentune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("rentune: interrupted", file=sys.stderr)
        return 130
