from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.core.settings import Settings, SettingsError, Theme
from desktop.services.platform.paths import app_paths
from desktop.services.platform.settings import load_settings, save_settings


def test_rentune_home_holds_everything(rentune_home: Path) -> None:
    paths = app_paths().ensure()
    for folder in (paths.config_dir, paths.data_dir, paths.cache_dir, paths.log_dir):
        assert folder.is_dir()
        assert folder.is_relative_to(rentune_home)


def test_without_rentune_home_the_platform_dirs_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RENTUNE_HOME")
    assert "Rentune" in str(app_paths().config_dir)


def test_missing_file_gives_defaults() -> None:
    assert load_settings() == Settings()


def test_round_trip_and_the_file_holds_no_secrets() -> None:
    path = save_settings(Settings(theme=Theme.DARK, keep_local_checkpoints=5))
    assert load_settings() == Settings(theme=Theme.DARK, keep_local_checkpoints=5)
    assert set(json.loads(path.read_text())) == set(Settings.model_fields)
    assert not list(path.parent.glob(".settings-*")), "no temporary file is left behind"


def test_broken_json_names_the_file_and_the_fix() -> None:
    path = app_paths().settings_file
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(SettingsError, match=r"settings\.json is not valid JSON.*fix or delete it"):
        load_settings()


def test_a_json_list_is_refused() -> None:
    path = app_paths().settings_file
    path.parent.mkdir(parents=True)
    path.write_text("[]")
    with pytest.raises(SettingsError, match="JSON object"):
        load_settings()


def test_a_file_from_an_older_rentune_with_a_removed_key_still_loads_and_the_key_is_dropped() -> None:
    path = app_paths().settings_file
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 1, "keep_local_checkpoints": 5, "allow_api_keys_on_remote": True}))
    assert load_settings() == Settings(keep_local_checkpoints=5)
    save_settings(load_settings())
    assert "allow_api_keys_on_remote" not in json.loads(path.read_text())


def test_updating_some_settings_keeps_the_others_as_the_file_has_them() -> None:
    from desktop.core.settings import RentOrBuyChoice
    from desktop.services.platform.settings import update_settings

    path = app_paths().settings_file
    save_settings(Settings(theme=Theme.DARK, rent_or_buy=RentOrBuyChoice(card="rtx5090")), path)
    stale = Settings()  # what another page loaded before the Costs page kept its card
    update_settings(stale.model_dump(include={"keep_local_checkpoints"}) | {"keep_local_checkpoints": 7}, path)
    kept = load_settings(path)
    assert kept.keep_local_checkpoints == 7 and kept.theme is Theme.DARK and kept.rent_or_buy.card == "rtx5090"
    with pytest.raises(SettingsError, match="invalid settings"):
        update_settings({"rent_or_buy": {"resale_percent": 150}}, path)
    assert load_settings(path).rent_or_buy.card == "rtx5090", "a refused change writes nothing"
