from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from desktop.services.run_keys import create_run_key, delete_run_key, install_command, load_run_key, remove_command
from tests.fixtures.memory_keyring import MemoryKeyring


def test_the_private_key_lives_in_the_keyring_only(memory_keyring: MemoryKeyring) -> None:
    public = create_run_key("r1")
    assert public is not None and public.startswith("ssh-ed25519 ") and public.endswith("rentune-run-r1")
    key = load_run_key("r1")
    assert key is not None and key.export_public_key().decode().strip() == public
    delete_run_key("r1")
    assert load_run_key("r1") is None


@pytest.mark.parametrize("form", ["plain", "home"])
def test_install_is_idempotent_and_remove_keeps_other_keys(
    tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    target = tmp_path / "ssh dir" / "authorized_keys"
    spelled = str(target) if form == "plain" else "~/ssh dir/authorized_keys"
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMdo31IKuF9gfdhGO1Luivwf5G46hIgUGTgUCO2euLxU rentune-run-x"
    target.parent.mkdir()
    target.write_text("ssh-ed25519 AAAAother user@laptop\n")
    for _ in range(2):
        subprocess.run(["sh", "-c", install_command(key, spelled)], check=True)
    assert target.read_text().splitlines() == ["ssh-ed25519 AAAAother user@laptop", key]
    subprocess.run(["sh", "-c", remove_command(key, spelled)], check=True)
    assert target.read_text() == "ssh-ed25519 AAAAother user@laptop\n"
