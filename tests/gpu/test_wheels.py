"""Carrying wheels to a GPU machine: the pins, the bundles that fit a device call, and what gets installed there."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.gpu.wheels import (
    PAYLOAD_PINS,
    REPO,
    SITE_DIR,
    SPECS,
    Wheel,
    WheelsError,
    check_pins,
    decide,
    image_brings,
    install,
    normalise,
    read_pins,
    split_bundles,
    write_bundles,
)


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), size: int = 0) -> Wheel:
    """A real (tiny) wheel: a module, its dist-info METADATA, and ``size`` bytes of padding."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    )
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", f"VERSION = {version!r}\n")
        archive.writestr(f"{name}/padding.bin", b"\0" * size)
        archive.writestr(f"{info}/METADATA", metadata + "\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return Wheel.of(path)


def test_carried_pins_match_the_payload_and_never_include_the_image_packages() -> None:
    carried, payload = read_pins(SPECS), read_pins(PAYLOAD_PINS)
    check_pins(carried, payload)
    assert {"trl", "accelerate", "datasets", "bitsandbytes"} <= set(carried)
    with pytest.raises(WheelsError, match="torch must not be carried"):
        check_pins({**carried, "torch": "2.13.0"}, payload)
    with pytest.raises(WheelsError, match="differs from the payload's pin"):
        check_pins({**carried, "trl": "0.1.0"}, payload)


def test_every_requirement_of_the_carried_packages_is_carried_or_comes_with_the_image() -> None:
    """What make gpu-wheels checks on the downloaded wheels, checked here on the installed packages."""
    from packaging.requirements import Requirement

    carried = read_pins(SPECS)
    available = set(carried) | image_brings()
    for name in carried:
        for raw in importlib.metadata.requires(name) or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                assert normalise(req.name) in available, f"{name} needs {req}: add it to tests/gpu/wheels.txt"


def test_bundles_fit_the_capacity_and_keep_every_wheel(tmp_path: Path) -> None:
    wheels = [make_wheel(tmp_path / "all", f"pkg{i}", "1.0", size=size) for i, size in enumerate((700, 500, 400, 300))]
    capacity = max(w.size for w in wheels) + 200
    bundles = split_bundles(wheels, capacity)
    assert all(sum(w.size for w in bundle) <= capacity for bundle in bundles)
    assert sorted(w.name for bundle in bundles for w in bundle) == ["pkg0", "pkg1", "pkg2", "pkg3"]
    folders = write_bundles(bundles, tmp_path)
    assert [f.name for f in folders] == [str(n) for n in range(1, len(bundles) + 1)]
    with pytest.raises(WheelsError, match="alone exceeds"):
        split_bundles(wheels, 100)


def test_decide_installs_what_is_missing_or_mispinned_and_the_dependencies_it_needs(tmp_path: Path) -> None:
    wheels = [
        make_wheel(tmp_path, "trl", "1.16.0", requires=("pandas>=2", "accelerate")),
        make_wheel(tmp_path, "pandas", "3.1.1"),
        make_wheel(tmp_path, "accelerate", "1.15.0"),
        make_wheel(tmp_path, "dill", "0.4.1"),
    ]
    image = {"trl": "1.0.0", "pandas": "1.5.3", "accelerate": "1.15.0", "dill": "0.3.8"}
    decisions = {d.wheel.name: d for d in decide(wheels, image, {}, {"trl": "1.16.0", "accelerate": "1.15.0"})}
    assert decisions["trl"].install and "pins 1.16.0" in decisions["trl"].reason
    assert decisions["pandas"].install and "trl needs >=2" in decisions["pandas"].reason
    assert not decisions["accelerate"].install
    assert not decisions["dill"].install and decisions["dill"].reason == "image has 0.3.8"


def test_install_puts_only_missing_packages_into_the_site_folder_and_skips_them_next_time(tmp_path: Path) -> None:
    carried = tmp_path / ".whl" / "1"
    make_wheel(carried, "rentune_gpu_probe_pkg", "1.0")
    make_wheel(carried, "pytest", "0.0.1")  # the running environment has pytest: not installed over it
    site = tmp_path / "site"
    lines = install(tmp_path / ".whl", site)
    assert "rentune-gpu-probe-pkg 1.0: installed (missing from the image)" in lines
    assert any(line.startswith("pytest 0.0.1: skipped (image has ") for line in lines)
    assert (site / "rentune_gpu_probe_pkg" / "__init__.py").is_file()
    assert not (site / "pytest").exists()
    again = install(tmp_path / ".whl", site)
    assert "rentune-gpu-probe-pkg 1.0: skipped (installed by an earlier call)" in again


def _copy_python_link_rest(source: str, target: str) -> None:
    """Copies Python files and links the rest (the native libraries keep their real path, as an install gives)."""
    if source.endswith(".py"):
        shutil.copy2(source, target)
    else:
        Path(target).symlink_to(source)


def test_packages_in_the_site_folder_let_datasets_fingerprint_data(tmp_path: Path) -> None:
    """dill, which datasets uses to fingerprint data, pickles a module by value when its file lies outside
    sys.prefix and outside any "site-packages" folder, and fails on pyarrow's types: the folder name matters.
    """
    import pyarrow

    site = tmp_path / SITE_DIR.relative_to(REPO)
    shutil.copytree(Path(pyarrow.__file__).parent, site / "pyarrow", copy_function=_copy_python_link_rest)
    script = "from datasets import Dataset; Dataset.from_list([{'text': 'hi'}]); print('fingerprinted')"
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=os.environ | {"PYTHONPATH": str(site)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert "fingerprinted" in result.stdout, result.stderr[-2000:]
