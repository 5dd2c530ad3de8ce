"""Finding the files shipped in ``resources/`` (icons, catalogs, examples), installed or from a source checkout.

In a wheel, ``resources/`` is packaged as ``desktop/_resources`` and read through :mod:`importlib.resources`. In a
source checkout or an editable install, the repository's top-level ``resources/`` is used.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path


class ResourceNotFoundError(FileNotFoundError):
    """A bundled resource is missing: the installation is incomplete."""


def resources_root() -> Traversable:
    """Returns the folder holding Rentune's bundled resources."""
    packaged = resources.files("desktop") / "_resources"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "resources"


def resource(*parts: str) -> Traversable:
    """Returns one bundled resource.

    Args:
        *parts: Path components below ``resources/``, e.g. ``("icons", "rentune.svg")``.

    Raises:
        ResourceNotFoundError: The resource is not there; reinstalling Rentune fixes it.
    """
    found = resources_root().joinpath(*parts)
    if not found.is_file():
        raise ResourceNotFoundError(f"bundled resource {'/'.join(parts)} is missing; reinstall Rentune")
    return found


def resource_bytes(*parts: str) -> bytes:
    """Returns the content of one bundled resource (see :func:`resource`)."""
    return resource(*parts).read_bytes()
