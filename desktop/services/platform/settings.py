"""Loading and saving :class:`~desktop.core.settings.Settings` as JSON, atomically."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import filelock

from desktop.core.settings import Settings, SettingsError, settings_from_dict
from desktop.services.platform.files import atomic_write_text
from desktop.services.platform.paths import app_paths


def load_settings(path: Path | None = None) -> Settings:
    """Reads the settings file, or returns defaults when there is none yet.

    Args:
        path: The file to read; the platform's settings file by default.

    Raises:
        SettingsError: The file is not valid JSON or holds invalid values; the message names the file and the fix.
    """
    path = path or app_paths().settings_file
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Settings()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}); fix or delete it") from exc
    if not isinstance(raw, dict):
        raise SettingsError(f"{path} must hold a JSON object; fix or delete it")
    try:
        return settings_from_dict(raw)
    except SettingsError as exc:
        raise SettingsError(f"{path}: {exc}") from exc


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Writes the settings atomically (a crash never leaves a half-written file).

    Args:
        settings: The settings to store.
        path: The file to write; the platform's settings file by default.

    Returns:
        The path written.
    """
    path = path or app_paths().settings_file
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, settings.model_dump_json(indent=2) + "\n")


def update_settings(changes: Mapping[str, Any], path: Path | None = None) -> Path:
    """Writes ``changes`` into the settings file and keeps every other setting as the file has it.

    Under the file's lock: two pages (or two windows) that change different settings never undo each other.

    Raises:
        SettingsError: The file cannot be read, or a changed value is invalid.
    """
    path = path or app_paths().settings_file
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(path.with_name(path.name + ".lock")):
        updated = settings_from_dict(load_settings(path).model_dump() | dict(changes))
        return save_settings(updated, path)


def installation_id(path: Path | None = None) -> str:
    """This installation's id, made and saved on first use (under a lock: two first starts agree on one id).

    Args:
        path: The settings file; the platform's by default.

    Raises:
        SettingsError: The settings file cannot be read (the message names it and the fix).
    """
    path = path or app_paths().settings_file
    settings = load_settings(path)
    if settings.installation_id:
        return settings.installation_id
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(path.with_name(path.name + ".lock")):
        settings = load_settings(path)  # another process may have made it meanwhile
        if not settings.installation_id:
            settings.installation_id = secrets.token_hex(4)
            save_settings(settings, path)
        return settings.installation_id
