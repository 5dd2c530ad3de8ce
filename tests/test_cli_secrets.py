"""Secrets at the edges: the CLI's error lines, the run manager's events and ``rentune doctor``."""

from __future__ import annotations

import json

import keyring.backends.fail
import keyring.backends.null
import pytest

from desktop.cli import main
from desktop.services.platform.secrets import SecretStore
from desktop.services.renting.manager import RunManager
from desktop.services.runs.store import RunStore
from tests.fixtures.memory_keyring import using_keyring

SECRET = "vast-" + "s3cr3t-0123456789"


def test_error_lines_mask_a_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VAST_API_KEY", SECRET)
    assert main(["status", SECRET]) == 2
    assert capsys.readouterr().err.strip() == "rentune: error: no run matches '***'; see rentune runs"
    with pytest.raises(SystemExit):
        main(["plan", "--no-such-flag", SECRET])
    err = capsys.readouterr().err
    assert SECRET not in err and "***" in err


def test_run_manager_events_are_masked_before_any_listener_hears_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_API_KEY", SECRET)
    runs = RunManager(RunStore(), SecretStore())
    heard: list[str] = []
    runs.add_listener(lambda _run_id, line: heard.append(line))
    runs.engine().report(f"the provider refused {SECRET}")
    assert heard == ["the provider refused ***"]


def test_doctor_shows_a_keyring_that_stores_nothing_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with using_keyring(keyring.backends.null.Keyring()):
        assert main(["doctor"]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if "Keyring" in line)
    assert line.startswith("[ERR] Keyring")
    assert "the keyring backend keyring.backends.null.Keyring stores nothing  -> unset PYTHON_KEYRING_BACKEND" in line


def test_doctor_without_any_keyring_says_where_run_keys_go_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    with using_keyring(keyring.backends.fail.Keyring()):
        assert main(["doctor", "--json"]) == 0
    (check,) = [check for check in json.loads(capsys.readouterr().out) if check["name"] == "Keyring"]
    assert not check["ok"] and not check["required"] and "run-keys" in check["fix"]
