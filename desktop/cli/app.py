"""``rentune``'s entry point: parse, hand the command to its group's module, and turn failures into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from desktop.cli.errors import EXIT_FAILED, CliError, print_error
from desktop.cli.parser import build_parser
from desktop.cli.settle import SETTLING_COMMANDS, settle_at_start

# Each command's (module, function): a group's module is imported only when one of its commands runs.
_COMMANDS: dict[str | None, tuple[str, str]] = {
    None: ("gui", "run_gui_command"),
    "gui": ("gui", "run_gui_command"),
    "doctor": ("doctor", "run_doctor"),
    "plan": ("plan", "run_plan"),
    "data": ("data", "run_data"),
    "offers": ("offers", "run_offers"),
    "machines": ("machines", "run_machines"),
    "costs": ("costs", "run_costs"),
    "keys": ("keys", "run_keys"),
    "storage": ("storage", "run_storage"),
    "export": ("export", "run_export"),
    "chat": ("chat", "run_chat"),
    "eval": ("evaluate", "run_eval"),
    "compare": ("evaluate", "run_eval"),
    "trial": ("trial", "run_trial_command"),
    "serve": ("serve", "run_serve"),
    "tensorboard": ("serve", "run_tensorboard"),
    "trackio": ("serve", "run_trackio"),
    "publish": ("publish", "run_publish"),
    "tools": ("tools", "run_tools"),
    "update-check": ("updates", "run_update_check"),
    **{name: ("runs", f"run_{name}") for name in ("run", "runs", "status", "logs", "stop", "pull", "resume")},
}


def _handler(command: str | None) -> Callable[[argparse.Namespace], int]:
    module, function = _COMMANDS[command]
    handler: Callable[[argparse.Namespace], int] = getattr(import_module(f"desktop.cli.{module}"), function)
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``rentune`` command line.

    Args:
        argv: The arguments (without the program name); ``sys.argv[1:]`` by default.

    Returns:
        The exit code: 0 success, 1 the command ran and found problems, 2 bad input.
    """
    args = build_parser().parse_args(argv)
    try:
        from desktop.services.local.toolenv import activate  # here: rentune --version imports nothing more

        activate()  # the local tools' private environment, once installed, is importable by every command
        if args.command in SETTLING_COMMANDS:
            settle_at_start()
        return _handler(args.command)(args)
    except CliError as exc:
        print_error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print("rentune: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last guard: one line here, the traceback goes to the log
        from desktop.services.runs.store import RunStoreError  # here: `rentune --version` loads no database code

        if isinstance(exc, RunStoreError):  # every command opens the run database: one answer for all of them
            print_error(str(exc))
            return EXIT_FAILED
        return _unexpected(exc)


def _unexpected(exc: Exception) -> int:
    """Prints one line for an error no command foresaw and logs its traceback for a bug report."""
    from desktop.services.platform.logs import configure_logging, get_logger

    try:
        where = f" (details in {configure_logging()})"
    except OSError:  # no writable log folder: the one line is all there is
        where = ""
    else:
        get_logger("cli").error("unexpected error", exc_info=exc)
    print_error(f"unexpected {type(exc).__name__}: {exc}; please report it{where}")
    return EXIT_FAILED
