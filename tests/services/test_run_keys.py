from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import keyring.backends.fail
import keyring.backends.null
import pytest

from desktop.services.machines.keys import (
    create_run_key,
    delete_run_key,
    install_command,
    key_file,
    load_run_key,
    remove_command,
)
from desktop.services.platform.paths import app_paths
from tests.fixtures.memory_keyring import MemoryKeyring, using_keyring


def test_the_private_key_lives_in_the_keyring_only(memory_keyring: MemoryKeyring) -> None:
    public = create_run_key("r1")
    assert public is not None and public.startswith("ssh-ed25519 ") and public.endswith("rentune-run-r1")
    key = load_run_key("r1")
    assert key is not None and key.export_public_key().decode().strip() == public
    delete_run_key("r1")
    assert load_run_key("r1") is None
    assert not key_file("r1").parent.exists(), "no file where a keyring works"


@pytest.mark.usefixtures("rentune_home")
def test_without_any_keyring_the_private_key_goes_to_a_file_only_the_user_can_read() -> None:
    with using_keyring(keyring.backends.fail.Keyring()):
        _file_round_trip()


def _file_round_trip() -> None:
    public = create_run_key("20250101-120000-ab12")
    assert public is not None and public.endswith("rentune-run-20250101-120000-ab12")
    path = key_file("20250101-120000-ab12")
    assert path == app_paths().data_dir / "run-keys" / "20250101-120000-ab12.key"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    private = path.read_text()
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "no partial file left beside it"
    key = load_run_key("20250101-120000-ab12")
    assert key is not None and key.export_public_key().decode().strip() == public
    delete_run_key("20250101-120000-ab12")
    assert not path.exists() and load_run_key("20250101-120000-ab12") is None


def test_a_keyring_that_drops_secrets_gets_no_run_key() -> None:
    with using_keyring(keyring.backends.null.Keyring()):
        assert create_run_key("r2") is None, "a key kept nowhere would lock the run out of its machine"
        assert load_run_key("r2") is None
    assert not key_file("r2").parent.exists()


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", ".hidden"])
def test_a_key_file_name_stays_in_its_folder(bad: str) -> None:
    with pytest.raises(ValueError, match="not a run id"):
        key_file(bad)


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


OTHER = "ssh-ed25519 AAAAother user@laptop"


def key_line(name: str) -> str:
    return f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{name} rentune-run-{name}"


def test_edits_replace_the_file_atomically_keeping_its_mode_and_other_lines(tmp_path: Path) -> None:
    target = tmp_path / "authorized_keys"
    target.write_text(OTHER)  # no final newline: the key must not join that line
    target.chmod(0o640)
    before = target.stat().st_ino
    subprocess.run(["sh", "-c", install_command(key_line("a"), str(target))], check=True)
    installed = target.stat()
    assert target.read_text().splitlines() == [OTHER, key_line("a")]
    assert installed.st_ino != before, "a new file renamed over the old one, never the old one truncated"
    assert installed.st_mode & 0o777 == 0o640
    subprocess.run(["sh", "-c", remove_command(key_line("a"), str(target))], check=True)
    assert target.read_text() == OTHER + "\n"
    assert target.stat().st_mode & 0o777 == 0o640 and target.stat().st_ino != installed.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["authorized_keys"], "no temp file left behind"


def test_a_new_file_is_private_and_a_symlinked_file_stays_a_symlink(tmp_path: Path) -> None:
    fresh = tmp_path / "new" / "authorized_keys"
    subprocess.run(["sh", "-c", install_command(key_line("a"), str(fresh))], check=True)
    assert fresh.stat().st_mode & 0o777 == 0o600
    real = tmp_path / "real_keys"
    real.write_text(OTHER + "\n")
    link = tmp_path / "link_keys"
    link.symlink_to(real)
    subprocess.run(["sh", "-c", install_command(key_line("b"), str(link))], check=True)
    assert link.is_symlink() and real.read_text().splitlines() == [OTHER, key_line("b")]


def _parallel(commands: list[str], env: dict[str, str] | None = None) -> None:
    running = [subprocess.Popen(["sh", "-c", command], env=env) for command in commands]
    assert [process.wait(timeout=120) for process in running] == [0] * len(commands)


@pytest.mark.parametrize("locking", ["flock", "lock folder"])
def test_runs_editing_at_once_lose_no_key(tmp_path: Path, locking: str) -> None:
    env = None
    if locking == "lock folder":  # a machine without flock(1): the same tools, flock left out
        tools = tmp_path / "bin"
        tools.mkdir()
        for tool in ("sh", "cat", "cp", "mv", "rm", "grep", "mkdir", "rmdir", "mktemp", "tail", "dirname", "sleep"):
            found = shutil.which(tool)
            assert found, tool
            (tools / tool).symlink_to(found)
        env = {"PATH": str(tools)}
    target = tmp_path / "authorized_keys"
    target.write_text(OTHER + "\n")
    names = [f"k{i}" for i in range(12)]
    _parallel([install_command(key_line(name), str(target)) for name in names], env)
    assert sorted(target.read_text().splitlines()) == sorted([OTHER] + [key_line(name) for name in names])
    _parallel([remove_command(key_line(name), str(target)) for name in names[:8]], env)
    assert sorted(target.read_text().splitlines()) == sorted([OTHER] + [key_line(name) for name in names[8:]])
    assert not list(tmp_path.glob("authorized_keys.*")), "no temp file or lock folder left behind"
