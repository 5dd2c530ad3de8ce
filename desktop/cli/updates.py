"""``rentune update-check``: is a newer Rentune released? It only says so, with the release's page."""

from __future__ import annotations

import argparse
import asyncio
import json

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.services.platform.updates import UpdateCheckError, check_for_update


def run_update_check(args: argparse.Namespace) -> int:
    """Runs ``rentune update-check``: one line (or JSON), exit 0 once the check was made."""
    try:
        found = asyncio.run(check_for_update())
    except UpdateCheckError as exc:
        raise CliError(str(exc), EXIT_FAILED) from None
    if args.json:
        print(json.dumps({"current": found.current, "newest": found.newest, "newer": found.newer, "url": found.url}))
    else:
        print(found.words())
    return EXIT_OK
