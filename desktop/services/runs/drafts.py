"""The wizard's draft: saved between sessions, sized with its prepared data, written as the CLI's ``SPEC.toml``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from desktop.core.runs.draft import ComputeDraft, RunDraft
from desktop.core.sizing.calibration import JobKind, Learned
from desktop.services.data.prepare import manifest_tokens, read_manifest
from desktop.services.models.sizing import Sizing, size_run
from desktop.services.platform.files import atomic_write_text
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretStore

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


def write_spec_toml(draft: RunDraft, path: Path, estimate: dict[str, Any] | None = None) -> Path:
    """Writes the draft as ``SPEC.toml`` (what ``rentune run`` reads) atomically; returns the path.

    ``estimate``, when given, is what the wizard showed the run would take (``[estimate]``): the monitor compares the
    run with the same numbers.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by the Rentune wizard. Run it again headless with: rentune run SPEC.toml\n\n"
    spec = draft.spec_dict() | ({"estimate": estimate} if estimate else {})
    return atomic_write_text(path, header + tomli_w.dumps(spec))


def size_draft(draft: RunDraft, secrets: SecretStore | None = None) -> Sizing:
    """Plans the draft's job with the token count of its prepared data (the manifest next to ``train_file``).

    Blocking (files, maybe the network): call it in an executor.

    Raises:
        desktop.services.models.sizing.SizingError: The job cannot be sized; the message says how to fix it.
    """
    manifest = read_manifest(draft.train_file)
    return size_run(draft, manifest_tokens(manifest) if manifest else None, secrets, learned_from_runs)


def learned_from_runs(kind: JobKind) -> Learned:
    """What the user's runs measured for this kind of job (their first minutes too): speeds, peaks, which runs."""
    from desktop.services.runs.estimates import learned_for

    return learned_for(kind)


def fresh_draft(previous: RunDraft) -> RunDraft:
    """The draft to start over with after a launch: the prepared data and the machine setup kept, the rest new.

    The data (prepared, checked) and the own server (tested, its host key pinned) or the rented machine's settings
    take effort to set up and rarely change between fine-tunes; the model, the method, the settings, the sizing
    pick, the offer (prices move) and the budget start from the defaults.
    """
    machine = previous.compute.model_dump(include={"python", "user", "image"})
    return RunDraft(
        data_file=previous.data_file,
        train_file=previous.train_file,
        eval_file=previous.eval_file,
        renting=previous.renting,
        compute=ComputeDraft(**machine),
        target=previous.target.model_copy(),
        hourly_rate_usd=previous.hourly_rate_usd,
    )
