"""Where Rentune keeps its files: the platform's directories, or one folder under ``RENTUNE_HOME``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "Rentune"
HOME_ENV = "RENTUNE_HOME"


@dataclass(frozen=True)
class AppPaths:
    """The directories of one Rentune installation.

    Attributes:
        config_dir: Settings (``settings.json``).
        data_dir: Runs, the ledger and pulled checkpoints.
        cache_dir: Downloaded tokenizers, model configs and other things that can be fetched again.
        log_dir: The app's log files (secrets redacted).
    """

    config_dir: Path
    data_dir: Path
    cache_dir: Path
    log_dir: Path

    @property
    def settings_file(self) -> Path:
        """The JSON file holding the user's settings."""
        return self.config_dir / "settings.json"

    @property
    def runs_dir(self) -> Path:
        """The folder holding one sub-folder per run."""
        return self.data_dir / "runs"

    def ensure(self) -> AppPaths:
        """Creates the directories if they are missing and returns ``self``."""
        for folder in (self.config_dir, self.data_dir, self.cache_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        return self


def app_paths() -> AppPaths:
    """Returns the directories to use now, reading ``RENTUNE_HOME`` at call time.

    With ``RENTUNE_HOME`` set, everything lives below that folder (handy for tests, portable installs and
    several profiles). Otherwise the platform's conventional directories are used.
    """
    home = os.environ.get(HOME_ENV)
    if home:
        root = Path(home).expanduser().resolve()
        return AppPaths(root / "config", root / "data", root / "cache", root / "logs")
    dirs = platformdirs.PlatformDirs(APP_NAME, appauthor=False)
    return AppPaths(
        Path(dirs.user_config_dir), Path(dirs.user_data_dir), Path(dirs.user_cache_dir), Path(dirs.user_log_dir)
    )
