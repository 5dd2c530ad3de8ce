from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import keyring.backends.fail
import keyring.backends.null
import pytest

from desktop.services.platform.environment import check_environment
from desktop.services.platform.resources import ResourceNotFoundError, resource, resource_bytes, resources_root
from tests.fixtures.memory_keyring import using_keyring

REPO = Path(__file__).resolve().parents[2]


def test_environment_report_lists_required_and_optional_parts() -> None:
    checks = {check.name: check for check in check_environment()}
    assert checks["Python"].ok and checks["Python"].required
    assert checks["Keyring"].ok, "the in-memory test keyring is a usable backend"
    assert checks["transformers"].ok, "the test environment installs the optional tools"
    assert "torch" not in checks, "doctor lists only tools a feature uses today"
    assert all(check.fix for check in checks.values() if not check.ok)
    assert checks["Large uploads"].ok and "sftp" in checks["Large uploads"].detail


def test_a_keyring_that_stores_nothing_is_a_required_problem_with_its_fix() -> None:
    with using_keyring(keyring.backends.null.Keyring()):
        checks = {check.name: check for check in check_environment()}
    keyring_check = checks["Keyring"]
    assert not keyring_check.ok and keyring_check.required, "it blocks renting: not 'ready'"
    assert keyring_check.detail == "the keyring backend keyring.backends.null.Keyring stores nothing"
    assert keyring_check.fix.startswith("unset PYTHON_KEYRING_BACKEND")


def test_no_keyring_at_all_is_reported_but_does_not_block() -> None:
    with using_keyring(keyring.backends.fail.Keyring()):
        keyring_check = next(check for check in check_environment() if check.name == "Keyring")
    assert not keyring_check.ok and not keyring_check.required
    assert "run keys are kept in files only you can read" in keyring_check.fix


def test_a_malformed_key_in_the_environment_gets_a_line_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "Keys in environment" not in {check.name for check in check_environment()}
    monkeypatch.setenv("LAMBDA_API_KEY", "secret_abc\n  secret_def")
    keys = next(check for check in check_environment() if check.name == "Keys in environment")
    assert not keys.ok and keys.fix.startswith("LAMBDA_API_KEY holds a Lambda Cloud API key with a line break")


def test_environment_report_says_when_uploads_use_the_built_in_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENTUNE_TRANSFER", "builtin")
    uploads = next(check for check in check_environment() if check.name == "Large uploads")
    assert uploads.ok and uploads.detail == "the built-in SSH client", "asked for: not a problem to fix"
    monkeypatch.delenv("RENTUNE_TRANSFER")
    monkeypatch.setenv("PATH", "")
    uploads = next(check for check in check_environment() if check.name == "Large uploads")
    assert not uploads.ok and "install the OpenSSH client" in uploads.fix


def test_resources_are_found_in_the_source_tree() -> None:
    assert resource_bytes("icons", "rentune.svg").startswith(b"<svg")
    assert Path(str(resources_root())) == REPO / "resources"


def test_a_missing_resource_says_to_reinstall() -> None:
    with pytest.raises(ResourceNotFoundError, match="reinstall"):
        resource("icons", "nope.svg")


@pytest.mark.slow
def test_the_wheel_ships_resources_and_both_packages(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
    )
    wheel = next(tmp_path.glob("rentune-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "installed")
    assert "desktop/_resources/icons/rentune.svg" in names
    assert "trainer_payload/protocol.py" in names
    assert "trainer_payload/requirements.txt" in names
    assert not any(name.startswith("tests/") for name in names)
    probe = (
        "from desktop.services.platform.resources import resources_root, resource_bytes; "
        "print(resources_root()); print(len(resource_bytes('icons', 'rentune.svg')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "installed")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == str(tmp_path / "installed" / "desktop" / "_resources")
    assert int(out[1]) > 100
