"""What this computer offers Rentune: Python, the keyring, the data folder and the optional tools.

Nothing here imports the heavy libraries it reports on; versions are read from package metadata, so the check is
instant even on a machine with torch installed.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from dataclasses import dataclass

from desktop.services.platform.paths import app_paths
from desktop.services.platform.programs import builtin_requested, find_openssh
from desktop.services.platform.secrets import environment_problems, probe_secret_store


@dataclass(frozen=True)
class EnvironmentCheck:
    """One line of the environment report.

    Attributes:
        name: What was checked.
        ok: Whether it is usable.
        detail: The version or state found.
        fix: What to do when it is not usable ("" when ok).
        required: Whether the app cannot work without it.
        is_tool: Whether it is an optional local model tool (it only unlocks features).
    """

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = False
    is_tool: bool = False


# Optional tools: (distribution name, what it unlocks, how to get it). The local tools' private environment
# (rentune tools install) holds them all; a source checkout can also install them into its own venv.
_OPTIONAL_TOOLS = [
    (
        "transformers",
        "exact token counts with the model's own tokenizer and chat template",
        "install the local tools: Models page, or rentune tools install",
    ),
    ("pyarrow", "Parquet datasets", "install the local tools: Models page, or rentune tools install"),
]


def _package_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _python_check() -> EnvironmentCheck:
    version = platform.python_version()
    ok = sys.version_info >= (3, 11)
    return EnvironmentCheck("Python", ok, version, "" if ok else "install Python 3.11 or newer", required=True)


def _keyring_check() -> EnvironmentCheck:
    """The secret store probe: a keyring that loses secrets blocks renting (required); none at all does not."""
    probe = probe_secret_store()
    if probe.ok:
        return EnvironmentCheck("Keyring", True, probe.backend)
    # Without one, API keys come from the environment and run keys from private files; a keyring that drops
    # secrets would lose a rented run's SSH key, so renting is refused until it is fixed.
    return EnvironmentCheck("Keyring", False, probe.finding, probe.fix, required=probe.blocks_renting)


def _environment_keys_check() -> EnvironmentCheck | None:
    """A line for secret environment variables that are set but malformed (None when all are fine)."""
    problems = environment_problems()
    if not problems:
        return None
    return EnvironmentCheck("Keys in environment", False, f"{len(problems)} cannot be used", "; ".join(problems))


def _data_dir_check() -> EnvironmentCheck:
    paths = app_paths()
    try:
        paths.ensure()
    except OSError as exc:
        return EnvironmentCheck("Data folder", False, str(paths.data_dir), f"make it writable ({exc})", required=True)
    return EnvironmentCheck("Data folder", True, str(paths.data_dir), required=True)


def _uploads_check() -> EnvironmentCheck:
    tools = find_openssh()
    if tools is not None:
        return EnvironmentCheck("Large uploads", True, f"OpenSSH's sftp ({tools.sftp})")
    if builtin_requested() or sys.platform == "win32":
        return EnvironmentCheck("Large uploads", True, "the built-in SSH client")
    return EnvironmentCheck(
        "Large uploads", False, "the built-in SSH client", "install the OpenSSH client (sftp, ssh-agent, ssh-add)"
    )


def check_environment() -> list[EnvironmentCheck]:
    """Checks what Rentune needs and what optional tools are installed.

    Returns:
        The required checks first, then one line per optional tool.
    """
    checks = [_python_check(), _keyring_check(), _data_dir_check(), _uploads_check()]
    keys = _environment_keys_check()
    if keys is not None:
        checks.insert(2, keys)
    for distribution, unlocks, how in _OPTIONAL_TOOLS:
        version = _package_version(distribution)
        detail = f"{version} ({unlocks})" if version else f"not installed ({unlocks})"
        checks.append(EnvironmentCheck(distribution, version is not None, detail, "" if version else how, is_tool=True))
    return checks
