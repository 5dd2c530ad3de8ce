"""The typed application settings and their schema migrations.

Settings hold preferences only. Secrets (API keys, tokens) never go here: they live in the OS keyring.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from desktop.core.storage import StorageSettings

SCHEMA_VERSION = 1


class SettingsError(ValueError):
    """The settings file cannot be understood; the message says what is wrong and how to fix it."""


class Theme(StrEnum):
    """The colour scheme of the desktop app."""

    SYSTEM = "system"
    LIGHT = "light"
    DARK = "dark"


class RentOrBuyChoice(BaseModel):
    """The card the user last weighed on Costs, and their own figures for it (None: the cards table's).

    Attributes:
        card: The cards table's id of the card.
        price_usd: What it costs to buy.
        watts: What the computer draws while it trains.
        kwh_usd: The electricity price per kilowatt-hour.
        resale_percent: What it sells for after ``years``, in percent of its price.
        years: How long it is kept.
        hours_per_year: Hours of rented training a year (None: the last 90 days' runs, extrapolated).
        rent_gpu: The GPU type rented, at its list price (None: as the user's runs rented, at what they cost).
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    card: str = Field(default="rtx4090", pattern="^[a-z0-9][a-z0-9-]{0,39}$")
    price_usd: float | None = Field(default=None, ge=0, le=10_000_000)
    watts: float | None = Field(default=None, gt=0, le=100_000)
    kwh_usd: float | None = Field(default=None, ge=0, le=10)
    resale_percent: float | None = Field(default=None, ge=0, le=100)
    years: float | None = Field(default=None, gt=0, le=30)
    hours_per_year: float | None = Field(default=None, ge=0, le=1_000_000)
    rent_gpu: str | None = Field(default=None, pattern="^[a-z0-9][a-z0-9-]{0,39}$")


class Settings(BaseModel):
    """User preferences, stored as JSON in the platform's config directory.

    Attributes:
        schema_version: Version of this layout; older files are migrated on load.
        theme: Follow the OS, or force light or dark.
        keep_local_checkpoints: How many pulled checkpoints of a run to keep on this computer.
        log_level: Level of the log file in the app's data directory.
        start_at_login: Start Rentune at login, minimised to the menu bar or tray (opt-in).
        notifications: Announce budget thresholds, idle or orphaned machines and finished or failed runs.
        check_for_updates: At start, ask for the newest release and say when it is newer (opt-in; never downloads).
        installation_id: This installation's id (8 hex digits, made on first use), carried in the names of the
            machines it rents so another computer's machines on the same account are never taken for orphans.
        rent_or_buy: The card weighed against renting on Costs, with the user's figures.
        storage: The user's bucket (its keys are in the keyring).
    """

    # Keys this version does not know (one an older Rentune wrote, like allow_api_keys_on_remote) are dropped on load.
    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    schema_version: int = SCHEMA_VERSION
    theme: Theme = Theme.SYSTEM
    keep_local_checkpoints: int = Field(default=3, ge=1, le=100)
    log_level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    start_at_login: bool = False
    notifications: bool = True
    check_for_updates: bool = False
    installation_id: str = Field(default="", pattern="^([0-9a-f]{8})?$")
    rent_or_buy: RentOrBuyChoice = Field(default_factory=RentOrBuyChoice)
    storage: StorageSettings = Field(default_factory=StorageSettings)


def settings_from_dict(raw: dict[str, Any]) -> Settings:
    """Builds settings from a decoded settings file, migrating older schema versions.

    Args:
        raw: The decoded JSON object.

    Returns:
        Valid settings at the current schema version.

    Raises:
        SettingsError: The file comes from a newer Rentune or holds invalid values.
    """
    version = raw.get("schema_version", 1)
    if not isinstance(version, int) or version < 1:
        raise SettingsError(f"settings schema_version {version!r} is not a positive integer; delete the file to reset")
    if version > SCHEMA_VERSION:
        raise SettingsError(
            f"settings were written by a newer Rentune (schema {version}, this one reads {SCHEMA_VERSION}); "
            "update Rentune or delete the settings file to reset"
        )
    try:
        return Settings.model_validate({**raw, "schema_version": SCHEMA_VERSION})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SettingsError(f"invalid settings ({problems}); fix the value or delete the file to reset") from exc
