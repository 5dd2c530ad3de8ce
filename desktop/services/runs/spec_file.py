"""Reading a SPEC.toml into a :class:`~desktop.core.runs.spec.RunSpec`, with a message for every way it can fail."""

from __future__ import annotations

import tomllib
from pathlib import Path

from desktop.core.runs.spec import RunSpec, RunSpecError, run_spec_from_dict
from desktop.services.platform.files import read_text


def read_run_spec(path: Path) -> RunSpec:
    """The run ``path`` describes (blocking).

    Raises:
        RunSpecError: The file is missing, unreadable, not TOML or not a valid run; the message names the fix.
    """
    if path.is_dir():
        raise RunSpecError(f"{path} is a folder; pass the SPEC.toml file itself")
    try:
        data = tomllib.loads(read_text(path))
    except FileNotFoundError as exc:
        raise RunSpecError(f"{path} does not exist; see resources/examples/SPEC.toml") from exc
    except OSError as exc:
        reason = exc.strerror or exc
        raise RunSpecError(f"{path} cannot be read ({reason}); check the path and its permissions") from exc
    except UnicodeDecodeError as exc:
        raise RunSpecError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8 in your editor"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise RunSpecError(f"{path} is not valid TOML: {exc}") from exc
    try:
        return run_spec_from_dict(data, path.resolve().parent, path.resolve())
    except RunSpecError as exc:
        raise RunSpecError(f"{path}: {exc}") from exc
