"""The lock files in installers/locks: complete, every file pinned by sha256, and a tampered hash stops pip."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "installers" / "locks"
LOCK_FILES = ("build-tools.txt", "base.txt", "dev-linux-x86_64-py311.txt", "dist-tools.txt")
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")
LINUX_311 = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.11"}


def locked(name: str) -> dict[str, tuple[str, list[str]]]:
    """Each package of a lock file: (version, hashes)."""
    packages: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", (LOCKS / name).read_text(encoding="utf-8")):
        match = _PIN.match(block)
        if match:
            packages[canonicalize_name(match[1])] = (match[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return packages


def project() -> dict[str, list[str]]:
    """pyproject.toml's dependencies (key "base") and extras."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {"base": data["dependencies"], **data["optional-dependencies"]}


@pytest.mark.parametrize("name", LOCK_FILES)
def test_every_locked_package_has_a_version_and_a_sha256(name: str) -> None:
    packages = locked(name)
    assert len(packages) > 5
    assert [package for package, (_version, hashes) in packages.items() if not hashes] == []


@pytest.mark.parametrize(("lock", "groups"), [("base.txt", ["base"]), ("dev-linux-x86_64-py311.txt", None)])
def test_the_locks_hold_every_dependency_in_its_range(lock: str, groups: list[str] | None) -> None:
    packages, wanted = locked(lock), project()
    for group in groups or list(wanted):
        for line in wanted[group]:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({**LINUX_311, "extra": group}):
                continue
            version, _hashes = packages[canonicalize_name(requirement.name)]
            assert requirement.specifier.contains(version, prereleases=True), f"{lock}: {requirement} has {version}"


def test_the_payload_and_local_tools_pins_are_the_locked_versions() -> None:
    packages = locked("dev-linux-x86_64-py311.txt")
    for requirements in ("trainer_payload/requirements.txt", "resources/local-tools/requirements.txt"):
        for line in (ROOT / requirements).read_text(encoding="utf-8").splitlines():
            requirement = line.split("#", 1)[0].strip()
            if "==" in requirement and ";" not in requirement:
                name, version = requirement.split("==")
                assert packages[canonicalize_name(name)][0].split("+")[0] == version, f"{requirements}: {name}"


def test_the_converter_source_pin_is_the_locked_sdist() -> None:
    pins = json.loads((ROOT / "resources/local-tools/llama-cpp-sources.json").read_text(encoding="utf-8"))
    version, hashes = locked("dev-linux-x86_64-py311.txt")["llama-cpp-python"]
    assert pins["llama-cpp-python"][version]["sha256"] in hashes


def test_a_tampered_hash_stops_pip_before_anything_is_installed(tmp_path: Path) -> None:
    version, _hashes = locked("base.txt")["annotated-types"]
    tampered = tmp_path / "tampered.txt"
    tampered.write_text(f"annotated-types=={version} --hash=sha256:{'0' * 64}\n", encoding="utf-8")
    target = tmp_path / "target"
    command = [sys.executable, "-m", "pip", "install", "--require-hashes", "--no-deps", "--target", str(target)]
    result = subprocess.run([*command, "-r", str(tampered)], capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in result.stderr and "annotated-types" in result.stderr
    assert not target.exists() or list(target.iterdir()) == []
