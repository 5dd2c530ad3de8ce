"""The payload's lock: every package the trainer needs besides the image's torch, each with its files' sha256.

``requirements-lock.txt`` is made by ``make lock`` (uv, from ``requirements.txt``, with torch left out so that the
image's own torch and CUDA libraries are never replaced). The bootstrap installs the entries this machine lacks with
``pip --require-hashes --no-deps``: pip takes exactly those files, and a file whose hash differs stops the install
before anything of it is unpacked. Markers are evaluated with ``packaging`` (pip's own copy when it is not installed).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK = Path(__file__).with_name("requirements-lock.txt")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==(\S+)")
#: The submodules of ``packaging`` used here: markers (:func:`applies`), requirements and the specifiers they hold
#: (:func:`torch_conflicts`).
PACKAGING_PARTS = ("markers", "requirements", "specifiers")


@dataclass(frozen=True)
class Locked:
    """One entry of the lock.

    Attributes:
        name: The distribution's canonical name.
        version: The locked version.
        marker: Where it applies (empty: everywhere).
        entry: The entry as pip reads it, on one line (``name==version ; marker --hash=sha256:...``).
    """

    name: str
    version: str
    marker: str
    entry: str


def tracker_lock(lock: Path, tracker: str) -> Path:
    """The lock of what a tracker needs besides ``lock`` (beside it: ``requirements-TRACKER-lock.txt``)."""
    return lock.with_name(f"requirements-{tracker}-lock.txt")


def job_entries(lock: Path, trackers: list[str]) -> list[Locked]:
    """The entries a job installs: ``lock``'s, then those of each tracker it reports to that has a lock of its own.

    A package in both keeps the main lock's entry (the trackers' locks are made at its versions).
    """
    entries = read_lock(lock)
    names = {entry.name for entry in entries}
    for tracker in trackers:
        extra = tracker_lock(lock, tracker)
        if extra.is_file():
            added = [entry for entry in read_lock(extra) if entry.name not in names]
            entries += added
            names.update(entry.name for entry in added)
    return entries


def canonical(name: str) -> str:
    """A distribution name as pip compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> list[Locked]:
    """The entries of a lock file written by ``uv pip compile --generate-hashes``."""
    entries = []
    for block in re.split(r"\n(?=[A-Za-z0-9])", path.read_text(encoding="utf-8")):
        text = " ".join(line.split("#", 1)[0].strip().rstrip("\\").strip() for line in block.splitlines())
        found = _PIN.match(text)
        if found:
            requirement = text.split("--hash", 1)[0]
            marker = requirement.partition(";")[2].strip()
            entries.append(Locked(canonical(found[1]), found[2].strip(";"), marker, " ".join(text.split())))
    return entries


def _packaging() -> Any:
    """``packaging`` with the submodules this module uses imported: the installed one, else pip's own copy.

    A bare image's Python has pip but not ``packaging``; pip always carries a copy (``pip._vendor.packaging``).
    """
    try:
        return _with_parts("packaging")
    except ImportError:
        return _with_parts("pip._vendor.packaging")


def _with_parts(package: str) -> Any:
    """The package after importing each of :data:`PACKAGING_PARTS` (a submodule is no attribute until imported).

    Raises:
        ImportError: The package or one of its parts is missing.
    """
    for part in PACKAGING_PARTS:
        importlib.import_module(f"{package}.{part}")
    return importlib.import_module(package)


def applies(entry: Locked) -> bool:
    """Whether the entry's marker holds for this interpreter."""
    return not entry.marker or bool(_packaging().markers.Marker(entry.marker).evaluate())


def installed_version(name: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def to_install(
    entries: list[Locked], kept: set[str], installed: Callable[[str], str | None] = installed_version
) -> list[Locked]:
    """The entries this machine needs: those that apply and are missing or at another version.

    The image's own torch stack and what torch itself depends on (``kept``, canonical names) stay as the image has
    them when present: replacing one of them could break the image's torch.
    """
    wanted = []
    for entry in entries:
        have = installed(entry.name)
        if not applies(entry) or have == entry.version or (have is not None and entry.name in kept):
            continue
        wanted.append(entry)
    return wanted


def torch_conflicts(entries: list[Locked], torch_version: str | None) -> list[str]:
    """``name needs torch<spec>`` for each installed locked package the image's torch does not satisfy."""
    if torch_version is None:
        return []
    requirements = _packaging().requirements
    conflicts = []
    for entry in entries:
        for line in _requires(entry.name):
            requirement = requirements.Requirement(line)
            if canonical(requirement.name) != "torch":
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            if not requirement.specifier.contains(torch_version.split("+")[0], prereleases=True):
                conflicts.append(f"{entry.name} {entry.version} needs torch{requirement.specifier}")
    return conflicts


def _requires(name: str) -> list[str]:
    """The Requires-Dist lines of an installed distribution (none when it is not installed)."""
    try:
        return importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []
