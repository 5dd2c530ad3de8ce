"""Wheels for a GPU machine without network: download and bundle them here, install the missing ones there.

Here (``make gpu-wheels``): downloads the pinned wheels of ``wheels.txt`` for CPython 3.12 on x86-64 Linux into
``.whl/all``, checks that every requirement they declare is carried or comes with torch, transformers and peft, and
splits them into bundles ``.whl/1``, ``.whl/2``... that each travel beside the working tree within what one device
call carries (64 MiB).

There (``make gpu-install``, ``make gpu-check``): installs into ``.gpu-site`` only the carried packages the image
lacks (or, for the payload's pins, has at another version), never torch, transformers or peft, so the image's own
builds stay the ones in use.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SPECS = Path(__file__).with_name("wheels.txt")
PAYLOAD_PINS = REPO / "trainer_payload" / "requirements.txt"
WHEELS_DIR = REPO / ".whl"
# The path must contain "site-packages": dill (which datasets uses to fingerprint data) pickles modules found
# elsewhere outside sys.prefix by value, and fails on pyarrow's types ("Can't pickle <class 'MonthDayNano'>").
SITE_DIR = REPO / ".gpu-site" / "site-packages"
IMAGE_ROOTS = ("torch", "transformers", "peft")
NEVER_CARRY = frozenset({*IMAGE_ROOTS, "torchvision", "torchaudio"})
CARRY_LIMIT = 64 * 2**20
# Headroom for what a listing of the working tree does not count (folders, the transfer's own bookkeeping).
CARRY_MARGIN = 2 * 2**20
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",  # bitsandbytes and pandas publish only this tag
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# The GPU machine's interpreter, for evaluating markers of requirements while downloading elsewhere.
TARGET_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


class WheelsError(RuntimeError):
    """A wheel set that cannot work on the GPU machine; the message says what to change."""


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Python_Dateutil`` -> ``python-dateutil``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def mib(size: int) -> str:
    """Bytes as MiB with one decimal."""
    return f"{size / 2**20:.1f} MiB"


def read_pins(path: Path) -> dict[str, str]:
    """The ``name==version`` lines of a requirements file, by normalised name."""
    pins = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            pins[normalise(name)] = version
    return pins


def _applies(requirement: Any, environment: Mapping[str, str] | None) -> bool:
    marker = requirement.marker
    return marker is None or bool(marker.evaluate({**(environment or {}), "extra": ""}))


@dataclass(frozen=True)
class Wheel:
    """A wheel file.

    Attributes:
        path: The file.
        name: Normalised distribution name.
        version: Its version.
    """

    path: Path
    name: str
    version: str

    @classmethod
    def of(cls, path: Path) -> Wheel:
        """Reads name and version from the file name (``name-version-tags.whl``)."""
        name, version = path.name.split("-")[:2]
        return cls(path, normalise(name), version)

    @property
    def size(self) -> int:
        """Bytes on disk."""
        return self.path.stat().st_size

    def requirements(self, environment: Mapping[str, str] | None = None) -> list[Any]:
        """The ``Requires-Dist`` entries that apply without extras (markers evaluated for ``environment``)."""
        from packaging.requirements import Requirement

        with zipfile.ZipFile(self.path) as archive:
            meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            text = archive.read(meta).decode("utf-8")
        lines = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
        return [req for req in map(Requirement, lines) if _applies(req, environment)]


# --- here: download, check, bundle -----------------------------------------------------------------------------------


def check_pins(carried: Mapping[str, str], payload: Mapping[str, str]) -> None:
    """Refuses a carried set that breaks the rules: never torch/transformers/peft, the payload's pins exactly.

    Raises:
        WheelsError: The first broken rule, with the fix.
    """
    banned = sorted(NEVER_CARRY & set(carried))
    if banned:
        raise WheelsError(f"{', '.join(banned)} must not be carried: the image's own build is what the check uses")
    for name, version in carried.items():
        if name in payload and payload[name] != version:
            raise WheelsError(f"{name}=={version} in wheels.txt differs from the payload's pin {payload[name]}")


def download(pins: Mapping[str, str], into: Path) -> list[Wheel]:
    """Downloads the pinned wheels (no dependencies, binaries only) for the GPU machine's Python into ``into``.

    Returns:
        The pinned wheels; other wheels left in ``into`` by earlier pins are removed.
    """
    into.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    command += [f"--platform={platform}" for platform in PLATFORMS]
    command += ["-d", str(into), *(f"{name}=={version}" for name, version in pins.items())]
    subprocess.run(command, check=True)
    wheels = []
    for path in sorted(into.glob("*.whl")):
        wheel = Wheel.of(path)
        if pins.get(wheel.name) == wheel.version:
            wheels.append(wheel)
        else:
            path.unlink()
    return wheels


def image_brings(roots: tuple[str, ...] = IMAGE_ROOTS) -> set[str]:
    """The distributions that come with ``roots`` (read from this environment's metadata, recursively)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = normalise(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            declared = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo.extend(req.name for req in map(Requirement, declared) if _applies(req, TARGET_ENV))
    return seen


def uncovered(wheels: list[Wheel], brought: set[str]) -> list[str]:
    """Requirements of the carried wheels that neither the carried set nor the image provides."""
    available = {wheel.name for wheel in wheels} | brought
    return [
        f"{wheel.name} {wheel.version} needs {req}"
        for wheel in wheels
        for req in wheel.requirements(TARGET_ENV)
        if normalise(req.name) not in available
    ]


def working_tree_bytes(repo: Path = REPO) -> int:
    """Bytes of what a device call copies besides carried folders: tracked and untracked, not ignored, files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8")
    files = (repo / name for name in listed.split("\0") if name)
    return sum(path.stat().st_size for path in files if path.is_file())


def split_bundles(wheels: list[Wheel], capacity: int) -> list[list[Wheel]]:
    """Packs the wheels into as few bundles of at most ``capacity`` bytes as first-fit decreasing finds.

    Raises:
        WheelsError: One wheel alone is larger than ``capacity``.
    """
    bundles: list[list[Wheel]] = []
    for wheel in sorted(wheels, key=lambda w: (-w.size, w.name)):
        if wheel.size > capacity:
            raise WheelsError(
                f"{wheel.path.name} ({mib(wheel.size)}) alone exceeds the {mib(capacity)} one call carries"
            )
        target = next((b for b in bundles if sum(w.size for w in b) + wheel.size <= capacity), None)
        if target is None:
            target = []
            bundles.append(target)
        target.append(wheel)
    return bundles


def write_bundles(bundles: list[list[Wheel]], root: Path) -> list[Path]:
    """Links each bundle's wheels into ``root/1``, ``root/2``... (replacing earlier bundles); returns the folders."""
    for old in root.iterdir():
        if old.is_dir() and old.name.isdigit():
            shutil.rmtree(old)
    folders = []
    for number, bundle in enumerate(bundles, start=1):
        folder = root / str(number)
        folder.mkdir()
        for wheel in bundle:
            try:
                os.link(wheel.path, folder / wheel.path.name)
            except OSError:
                shutil.copy2(wheel.path, folder / wheel.path.name)
        folders.append(folder)
    return folders


def describe_bundles(bundles: list[list[Wheel]], tree: int) -> list[str]:
    """The sizes, and the device calls that carry the bundles in order."""
    lines = [f"working tree: {mib(tree)} (travels with every call; a call carries {mib(CARRY_LIMIT)} in all)"]
    for number, bundle in enumerate(bundles, start=1):
        size = sum(w.size for w in bundle)
        names = ", ".join(f"{w.name} {w.version} ({mib(w.size)})" for w in bundle)
        lines.append(f".whl/{number}: {mib(size)} + tree = {mib(size + tree)}: {names}")
    lines.append("On the GPU machine, one call per bundle while it stays warm, in this order:")
    for number in range(1, len(bundles) + 1):
        target = "gpu-check" if number == len(bundles) else "gpu-install"
        lines.append(f"  carry .whl/{number}, run: make {target}")
    return lines


def prepare(root: Path = WHEELS_DIR) -> list[str]:
    """``make gpu-wheels``: download, check and bundle; returns the summary lines.

    Raises:
        WheelsError: The pins break a rule, a requirement is not covered, or a wheel cannot be carried.
    """
    pins = read_pins(SPECS)
    check_pins(pins, read_pins(PAYLOAD_PINS))
    wheels = download(pins, root / "all")
    missing = sorted(set(pins) - {w.name for w in wheels})
    if missing:
        raise WheelsError(f"pip downloaded no wheel for {', '.join(missing)}")
    gaps = uncovered(wheels, image_brings())
    if gaps:
        raise WheelsError("add to tests/gpu/wheels.txt what these need: " + "; ".join(gaps))
    tree = working_tree_bytes()
    bundles = split_bundles(wheels, CARRY_LIMIT - tree - CARRY_MARGIN)
    write_bundles(bundles, root)
    return describe_bundles(bundles, tree)


# --- there: install what the image lacks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """Whether a carried wheel gets installed, and why."""

    wheel: Wheel
    install: bool
    reason: str


def installed_versions(paths: list[str]) -> dict[str, str]:
    """Distributions found on ``paths`` (the first of a name wins, as imports do), by normalised name."""
    versions: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if name:
            versions.setdefault(normalise(name), dist.version)
    return versions


def _first_decision(
    wheel: Wheel, image: Mapping[str, str], site: Mapping[str, str], pins: Mapping[str, str]
) -> Decision:
    if wheel.name in NEVER_CARRY:
        return Decision(wheel, False, "never installed: the image's own build is used")
    if site.get(wheel.name) == wheel.version:
        return Decision(wheel, False, "installed by an earlier call")
    have = image.get(wheel.name)
    if have is None:
        return Decision(wheel, True, "missing from the image")
    if wheel.name in pins and pins[wheel.name] != have:
        return Decision(wheel, True, f"image has {have}, the payload pins {wheel.version}")
    return Decision(wheel, False, f"image has {have}")


def decide(
    wheels: list[Wheel], image: Mapping[str, str], site: Mapping[str, str], pins: Mapping[str, str]
) -> list[Decision]:
    """Chooses the wheels to install: missing ones, pinned ones at another version, and any carried dependency
    whose image version does not satisfy a wheel that gets installed.
    """
    decisions = {w.name: _first_decision(w, image, site, pins) for w in wheels}
    changed = True
    while changed:
        changed = False
        for chosen in [d for d in decisions.values() if d.install]:
            for req in chosen.wheel.requirements():
                dep = decisions.get(normalise(req.name))
                if dep is None or dep.install or dep.wheel.name in NEVER_CARRY:
                    continue
                have = site.get(dep.wheel.name) or image.get(dep.wheel.name)
                if have is None or not req.specifier.contains(have, prereleases=True):
                    why = f"image has {have}, {chosen.wheel.name} needs {req.specifier}"
                    decisions[dep.wheel.name] = Decision(dep.wheel, True, why)
                    changed = True
    return sorted(decisions.values(), key=lambda d: d.wheel.name)


def unmet(wheels: list[Wheel], effective: Mapping[str, str]) -> list[str]:
    """Requirements of the carried wheels in use that the environment does not satisfy."""
    problems = []
    for wheel in wheels:
        if effective.get(wheel.name) != wheel.version:
            continue
        for req in wheel.requirements():
            have = effective.get(normalise(req.name))
            if have is None:
                problems.append(f"{wheel.name} {wheel.version} needs {req}: not installed")
            elif not req.specifier.contains(have, prereleases=True):
                problems.append(f"{wheel.name} {wheel.version} needs {req}: found {have}")
    return problems


def carried_wheels(root: Path) -> list[Wheel]:
    """Every wheel under ``root`` (any bundle folder), one per file name."""
    unique = {path.name: path for path in sorted(root.rglob("*.whl"))} if root.is_dir() else {}
    return [Wheel.of(path) for path in unique.values()]


def _extract(wheel: Wheel, site: Path) -> None:
    """Unpacks a wheel the way pip --target does for packages without headers (scripts are left out)."""
    with zipfile.ZipFile(wheel.path) as archive:
        members = [m for m in archive.namelist() if not m.split("/", 1)[0].endswith(".data")]
        archive.extractall(site, members)


def install_wheels(wheels: list[Wheel], site: Path) -> None:
    """Installs the wheels into ``site`` without dependencies or network (pip, or unpacking where pip is absent)."""
    site.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("pip") is None:
        for wheel in wheels:
            _extract(wheel, site)
        return
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(site)]
    subprocess.run([*command, *(str(w.path) for w in wheels)], check=True)


def image_paths(site: Path) -> list[str]:
    """This interpreter's import path without the carried site folder."""
    return [p for p in sys.path if p and Path(p).resolve() != site.resolve()]


def install(root: Path = WHEELS_DIR, site: Path = SITE_DIR) -> list[str]:
    """``make gpu-install``: installs what the image lacks from every wheel under ``root``; returns report lines."""
    wheels = carried_wheels(root)
    if not wheels:
        return [f"no wheels under {root}: nothing installed (carry a .whl/N folder made by make gpu-wheels)"]
    image = installed_versions(image_paths(site))
    site_versions = installed_versions([str(site)]) if site.is_dir() else {}
    decisions = decide(wheels, image, site_versions, read_pins(PAYLOAD_PINS))
    chosen = [d.wheel for d in decisions if d.install]
    if chosen:
        install_wheels(chosen, site)
    own = ", ".join(f"{name} {image.get(name, 'absent')}" for name in IMAGE_ROOTS)
    lines = [f"image (Python {sys.version.split()[0]}): {own}; never replaced"]
    lines += [
        f"{d.wheel.name} {d.wheel.version}: {'installed' if d.install else 'skipped'} ({d.reason})" for d in decisions
    ]
    effective = {**image, **installed_versions([str(site)])} if site.is_dir() else image
    problems = unmet(wheels, effective)
    if problems:
        lines.append(
            "not satisfied yet (expected until every .whl/N bundle is installed; the check lists what is missing):"
        )
        lines += [f"  {problem}" for problem in problems]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.gpu.wheels download|install``."""
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.wheels", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("download", "install"))
    parser.add_argument("--wheels", type=Path, default=WHEELS_DIR, help="folder of the wheels (default .whl)")
    parser.add_argument(
        "--site", type=Path, default=SITE_DIR, help="install target there (default .gpu-site/site-packages)"
    )
    args = parser.parse_args(argv)
    try:
        lines = prepare(args.wheels) if args.command == "download" else install(args.wheels, args.site)
    except (WheelsError, subprocess.CalledProcessError) as exc:
        print(f"gpu wheels: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
