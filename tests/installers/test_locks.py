"""The lock files in installers/locks: complete, every file pinned by sha256, and a tampered hash stops pip."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "installers" / "locks"
TOOLS_LOCK = "resources/local-tools/requirements.txt"
TOOLS = ROOT / "resources" / "local-tools"
PAYLOAD_LOCK = "trainer_payload/requirements-lock.txt"
LOCK_FILES = (
    "build-tools.txt", "base.txt", "dev-linux-x86_64-py311.txt", "dist-tools.txt", "../../" + TOOLS_LOCK,
    "../../" + PAYLOAD_LOCK,
)  # fmt: skip
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")
LINUX_311 = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.11"}


def locked(name: str) -> dict[str, tuple[str, list[str]]]:
    """Each package of a lock file (in installers/locks, or a path from there): (version, hashes)."""
    return {name: (version, hashes) for name, (version, hashes, _marker) in entries(LOCKS / name).items()}


def entries(path: Path, environment: dict[str, str] | None = None) -> dict[str, tuple[str, list[str], str]]:
    """Each package of a lock file whose marker holds in ``environment`` (all when None): (version, hashes, marker)."""
    packages: dict[str, tuple[str, list[str], str]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", path.read_text(encoding="utf-8")):
        match = _PIN.match(block)
        if not match:
            continue
        marker = block.split("\\\n", 1)[0].partition(";")[2].strip()
        if environment is None or not marker or Marker(marker).evaluate(environment):
            packages[canonicalize_name(match[1])] = (
                match[2],
                re.findall(r"--hash=sha256:([0-9a-f]{64})", block),
                marker,
            )
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
    for requirements in ("trainer_payload/requirements.txt", "resources/local-tools/requirements.in"):
        for line in (ROOT / requirements).read_text(encoding="utf-8").splitlines():
            requirement = line.split("#", 1)[0].strip()
            if "==" in requirement and ";" not in requirement:
                name, version = requirement.split("==")
                name = name.split("[", 1)[0]  # llama-cpp-python[server]: the package, with its extra
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


PLATFORMS = {
    "linux-x86_64": LINUX_311,
    "macos-arm64": {"sys_platform": "darwin", "platform_machine": "arm64", "python_version": "3.12"},
    "windows-x86_64": {"sys_platform": "win32", "platform_machine": "AMD64", "python_version": "3.13"},
}


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_the_local_tools_lock_holds_every_wanted_package_for_each_platform(platform: str) -> None:
    environment = PLATFORMS[platform]
    packages = entries(TOOLS / "requirements.txt", environment)
    for line in (TOOLS / "requirements.in").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        version, hashes, _marker = packages[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version, prereleases=True) and hashes, f"{platform}: {requirement}"
    assert ("mlx-lm" in packages) == (platform == "macos-arm64")
    assert not [name for name in packages if name.startswith(("nvidia-", "triton"))], "no CUDA build anywhere"


def test_the_local_tools_build_with_the_projects_locked_build_tools() -> None:
    assert (TOOLS / "build-tools.txt").read_text(encoding="utf-8") == (LOCKS / "build-tools.txt").read_text(
        encoding="utf-8"
    ), "make lock copies installers/locks/build-tools.txt to resources/local-tools/"
