from __future__ import annotations

import pytest

from desktop.core.settings import SCHEMA_VERSION, Settings, SettingsError, Theme, settings_from_dict


def test_defaults() -> None:
    settings = Settings()
    assert settings.schema_version == SCHEMA_VERSION
    assert settings.theme is Theme.SYSTEM
    assert settings.keep_local_checkpoints == 3


def test_a_file_without_version_is_read_as_version_one_and_unknown_keys_are_dropped() -> None:
    settings = settings_from_dict({"theme": "dark", "from_the_future": 1})
    assert settings.theme is Theme.DARK
    assert "from_the_future" not in settings.model_dump()


def test_a_newer_schema_is_refused_with_the_fix() -> None:
    with pytest.raises(SettingsError, match=r"newer Rentune.*update Rentune or delete"):
        settings_from_dict({"schema_version": SCHEMA_VERSION + 1})


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"keep_local_checkpoints": 0}, "keep_local_checkpoints"),
        ({"theme": "purple"}, "theme"),
        ({"log_level": "LOUD"}, "log_level"),
    ],
)
def test_invalid_values_name_the_field(raw: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        settings_from_dict(raw)


def test_bad_version_type() -> None:
    with pytest.raises(SettingsError, match="schema_version"):
        settings_from_dict({"schema_version": "one"})


def test_a_file_from_before_the_cost_tracker_gets_its_defaults() -> None:
    settings = settings_from_dict({"schema_version": 1, "theme": "light", "keep_local_checkpoints": 5})
    assert settings.start_at_login is False and settings.notifications is True
    assert settings.keep_local_checkpoints == 5
    assert settings_from_dict(settings.model_dump()) == settings


def test_start_at_login_and_notifications_must_be_yes_or_no() -> None:
    with pytest.raises(SettingsError, match="start_at_login"):
        settings_from_dict({"start_at_login": "sometimes"})
