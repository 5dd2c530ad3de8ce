"""Command line of the trainer payload: ``python -m trainer_payload``."""

from __future__ import annotations

import argparse
import sys

from trainer_payload import __version__
from trainer_payload.protocol import PROTOCOL_VERSION


def build_parser() -> argparse.ArgumentParser:
    """Returns the payload's argument parser."""
    parser = argparse.ArgumentParser(prog="python -m trainer_payload", description="Rentune's trainer payload.")
    parser.add_argument(
        "--version", action="version", version=f"trainer_payload {__version__} (protocol {PROTOCOL_VERSION})"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parses the command line and runs the chosen command.

    Returns:
        The process exit code.
    """
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
