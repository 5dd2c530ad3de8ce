"""Builds the Rentune bundle for this platform: ``make dist`` runs it with the build venv's Python (base app only).

Steps: render the icons from ``resources/icons/rentune.svg`` (PNG, ICO, ICNS, with Qt), run PyInstaller on
``installers/pyinstaller/rentune.spec``, refuse a bundle holding torch or a CUDA library, then package it:
Linux a ``.tar.gz`` and a ``.deb``, macOS a ``.dmg`` holding ``Rentune.app``, Windows an Inno Setup per-user
installer (when Inno Setup's ``iscc`` is on PATH). Prints each artefact with its size.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
DIST = ROOT / "dist"
ICONS = BUILD / "icons"
#: Files whose presence means a heavy library slipped into the bundle.
FORBIDDEN = re.compile(r"(^|/)(torch|libtorch[^/]*|libcudart[^/]*|libcublas[^/]*|libcudnn[^/]*|nvidia)(/|$|\.)")


def version() -> str:
    """The app's version, read from ``desktop/__init__.py`` (without importing the app)."""
    text = (ROOT / "desktop" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if not found:
        raise SystemExit("desktop/__init__.py has no __version__")
    return found.group(1)


def render_icons() -> None:
    """Writes rentune.png (512 px), rentune.ico and rentune.icns into build/icons."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication([])
    renderer = QSvgRenderer(str(ROOT / "resources" / "icons" / "rentune.svg"))
    ICONS.mkdir(parents=True, exist_ok=True)
    image = QImage(512, 512, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    for name in ("rentune.png", "rentune.icns"):
        if not image.save(str(ICONS / name)):
            raise SystemExit(f"could not write {ICONS / name}")
    if not image.scaled(256, 256, mode=Qt.TransformationMode.SmoothTransformation).save(str(ICONS / "rentune.ico")):
        raise SystemExit(f"could not write {ICONS / 'rentune.ico'}")
    del app


def run_pyinstaller() -> Path:
    """Builds dist/rentune (onedir) and returns it."""
    spec = ROOT / "installers" / "pyinstaller" / "rentune.spec"
    command = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN"]
    subprocess.run([*command, "--distpath", str(DIST), "--workpath", str(BUILD / "pyinstaller"), str(spec)], check=True)
    return DIST / "rentune"


def check_no_heavy_libraries(bundle: Path) -> None:
    """Stops the build when torch or a CUDA library is in the bundle: the local tools are installed on demand."""
    found = [str(path.relative_to(bundle)) for path in bundle.rglob("*") if FORBIDDEN.search(path.name)]
    if found:
        raise SystemExit(f"the bundle must not hold torch or CUDA, but has: {', '.join(found[:10])}")


def package_linux(bundle: Path, release: str) -> list[Path]:
    """A .tar.gz of the bundle, and a .deb installing it under /opt/rentune with a menu entry."""
    arch = platform.machine()
    tarball = DIST / f"rentune-{release}-linux-{arch}.tar.gz"
    # gzip level 6: a third of level 9's time here (8 s against 26 s) for 0.4 % more bytes
    with tarfile.open(tarball, "w:gz", compresslevel=6) as archive:
        archive.add(bundle, arcname=f"rentune-{release}")
    artefacts = [tarball]
    if shutil.which("dpkg-deb"):
        artefacts.append(build_deb(bundle, release))
    else:
        print("dpkg-deb not found: no .deb built (the .tar.gz is complete)")
    return artefacts


def build_deb(bundle: Path, release: str) -> Path:
    """A .deb: the bundle in /opt/rentune, /usr/bin/rentune, a desktop entry and the icon."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    root = BUILD / "deb-root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(bundle, root / "opt" / "rentune", symlinks=True)
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "rentune").symlink_to("/opt/rentune/rentune")
    icons = root / "usr" / "share" / "icons" / "hicolor" / "scalable" / "apps"
    icons.mkdir(parents=True)
    shutil.copy(ROOT / "resources" / "icons" / "rentune.svg", icons / "rentune.svg")
    applications = root / "usr" / "share" / "applications"
    applications.mkdir(parents=True)
    shutil.copy(ROOT / "installers" / "linux" / "rentune.desktop", applications / "rentune.desktop")
    control = (ROOT / "installers" / "linux" / "control").read_text(encoding="utf-8")
    size_kb = sum(path.stat().st_size for path in (root / "opt").rglob("*") if path.is_file()) // 1024
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(
        control.format(version=release, arch=arch, size_kb=size_kb), encoding="utf-8"
    )
    target = DIST / f"rentune_{release}_{arch}.deb"
    # zstd: 1 s to build against xz's 2 min here (109 MB against 84 MB); dpkg reads it since 1.21
    subprocess.run(["dpkg-deb", "-Zzstd", "--root-owner-group", "--build", str(root), str(target)], check=True)
    return target


def package_macos(release: str) -> list[Path]:
    """A .dmg holding Rentune.app (signing and notarisation: see installers/README.md)."""
    app = DIST / "Rentune.app"
    image = DIST / f"Rentune-{release}-macos-{platform.machine()}.dmg"
    image.unlink(missing_ok=True)
    subprocess.run(
        ["hdiutil", "create", "-volname", "Rentune", "-srcfolder", str(app), "-ov", "-format", "UDZO", str(image)],
        check=True,
    )
    return [image]


def package_windows(release: str) -> list[Path]:
    """A per-user installer made with Inno Setup (installers/windows/rentune.iss), when iscc is installed."""
    iscc = shutil.which("iscc") or shutil.which("ISCC")
    if not iscc:
        print("Inno Setup's iscc is not on PATH: only dist/rentune was built (install Inno Setup 6 for the installer)")
        return []
    script = ROOT / "installers" / "windows" / "rentune.iss"
    subprocess.run([iscc, f"/DAppVersion={release}", f"/O{DIST}", str(script)], check=True)
    return [DIST / f"Rentune-{release}-windows-setup.exe"]


def folder_size(folder: Path) -> int:
    """Bytes of the files below ``folder``."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def main() -> None:
    """Builds and packages the bundle, printing what was made."""
    release = version()
    render_icons()
    bundle = run_pyinstaller()
    check_no_heavy_libraries(bundle)
    if sys.platform == "darwin":
        artefacts = package_macos(release)
    elif sys.platform == "win32":
        artefacts = package_windows(release)
    else:
        artefacts = package_linux(bundle, release)
    print(f"bundle: {bundle} ({folder_size(bundle) / 1e6:.0f} MB, no torch, no CUDA)")
    for artefact in artefacts:
        print(f"package: {artefact} ({artefact.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
