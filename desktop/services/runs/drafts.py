"""Saving the wizard's draft between sessions, and writing it out as the ``SPEC.toml`` the CLI uses."""

from __future__ import annotations

import json
from pathlib import Path

import tomli_w
from pydantic import ValidationError

from desktop.core.runs.draft import RunDraft
from desktop.services.platform.files import atomic_write_text
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths

DRAFT_FILE_NAME = "wizard_draft.json"
_log = get_logger("drafts")


def draft_path() -> Path:
    """Where the wizard's draft lives."""
    return app_paths().data_dir / DRAFT_FILE_NAME


def load_draft(path: Path | None = None) -> RunDraft:
    """The saved draft, or a fresh one when there is none or it cannot be read (the reason is logged)."""
    path = path or draft_path()
    try:
        return RunDraft.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return RunDraft()
    except (OSError, ValueError, ValidationError) as exc:
        _log.warning("ignoring the unreadable wizard draft %s (%s); starting a new one", path, exc)
        return RunDraft()


def save_draft(draft: RunDraft, path: Path | None = None) -> Path:
    """Writes the draft atomically (a crash never leaves half a file)."""
    path = path or draft_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, draft.model_dump_json(indent=2))


def write_spec_toml(draft: RunDraft, path: Path) -> Path:
    """Writes the draft as ``SPEC.toml`` (what ``rentune run`` reads) atomically; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by the Rentune wizard. Run it again headless with: rentune run SPEC.toml\n\n"
    return atomic_write_text(path, header + tomli_w.dumps(draft.spec_dict()))
