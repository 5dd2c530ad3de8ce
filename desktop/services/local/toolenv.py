"""The local tools' private environment: torch, transformers, peft and llama.cpp, installed on demand.

It lives under the data folder, for an app that does not have the tools itself (the bundled app never does).

``rentune tools install`` (or the Models page) makes a virtual environment from a Python of the app's own version
and pip-installs the locked stack into it (``resources/local-tools/requirements.txt``: every file's sha256, for Linux
x86-64, macOS arm64 and Windows x86-64; pip takes nothing else, and a file whose hash differs stops the install before
anything of it is unpacked); a marker file written last
says it is complete, so an interrupted install is finished by running it again (pip keeps what it installed and its
cache keeps what it downloaded). Once complete, the app imports the tools from it (:func:`activate`) and runs its
child jobs with its Python (:func:`local_python`). Removing it deletes the folder.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import platform
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from types import ModuleType

from desktop.services.local.common import LocalToolError, Progress, folder_bytes, require_free_space, run_program
from desktop.services.platform.paths import app_paths
from desktop.services.platform.resources import resource_bytes
from desktop.services.platform.secrets import without_secrets

TOOLS_FOLDER = "local-tools"
MARKER = "rentune-tools.json"
#: A file in the environment's site-packages naming the folder that holds the app's own ``desktop`` package, so the
#: environment's Python runs the app's child jobs (``python -m trainer_payload.merge``).
APP_PATH_FILE = "rentune-app.pth"
#: Overrides the Python the environment is made from (its version must be the app's).
PYTHON_ENV = "RENTUNE_TOOLS_PYTHON"
#: Space-separated pages or folders pip may also find files in ("" for none). The default is torch's own page on
#: Linux (its CPU build is not on PyPI); PyPI is the only index. The lock's hashes decide what is taken, wherever from.
FIND_LINKS_ENV = "RENTUNE_TOOLS_FIND_LINKS"
TORCH_CPU_PAGE = "https://download.pytorch.org/whl/cpu/torch/"
#: CMake code run inside llama.cpp's own project when llama-cpp-python is built here: it turns off llama.cpp's
#: ``common`` library, which llama-cpp-python forces on but never loads (the file says what that saves).
LEAN_CMAKE = "llama-cpp-lean.cmake"
#: About what the stack takes on disk once installed (torch's CPU build is most of it), for the free-space check.
INSTALLED_BYTES = 1_600_000_000
#: The distributions listed in the status, in the order a user cares about.
LISTED = ("torch", "transformers", "peft", "llama_cpp_python", "sentencepiece", "protobuf", "pyarrow", "mlx-lm")


class ToolsState(StrEnum):
    """How far the environment is."""

    ABSENT = "absent"
    PARTIAL = "partial"  # begun and interrupted: install again to finish
    INSTALLED = "installed"
    OUTDATED = "outdated"  # finished from an older lock: it works, and installing again adds what this app uses
    OTHER_PYTHON = "other_python"  # made for another Python version than the app's: install again to replace it


@dataclass(frozen=True)
class ToolsStatus:
    """What the environment holds.

    Attributes:
        folder: Where it lives.
        state: How far it is.
        size_bytes: What it takes on disk (0 when absent).
        python_version: Its Python's ``X.Y``, once made.
        packages: The main distributions installed and their versions.
    """

    folder: Path
    state: ToolsState
    size_bytes: int = 0
    python_version: str | None = None
    packages: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolsEnv:
    """The environment's folder and the paths inside it."""

    folder: Path

    @property
    def python(self) -> Path:
        """Its Python interpreter."""
        if sys.platform == "win32":
            return self.folder / "Scripts" / "python.exe"
        return self.folder / "bin" / "python"

    @property
    def marker(self) -> Path:
        """The file written once the install has finished."""
        return self.folder / MARKER

    def site_packages(self, version: str | None = None) -> Path:
        """Its site-packages folder (for Python ``version``, this one's by default)."""
        if sys.platform == "win32":
            return self.folder / "Lib" / "site-packages"
        return self.folder / "lib" / f"python{version or app_python_version()}" / "site-packages"

    def marker_python(self) -> str | None:
        """The Python version the finished install was made for, or None when it has not finished."""
        try:
            return str(json.loads(self.marker.read_text(encoding="utf-8"))["python"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def marker_requirements(self) -> str | None:
        """The sha256 of the lock the finished install was made from, or None."""
        try:
            return str(json.loads(self.marker.read_text(encoding="utf-8"))["requirements_sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def complete(self) -> bool:
        """Whether the install finished, for this app's Python version."""
        return self.marker_python() == app_python_version() and self.python.exists()


def tools_env() -> ToolsEnv:
    """The environment of the current profile (under the data folder)."""
    return ToolsEnv(app_paths().data_dir / TOOLS_FOLDER)


def app_python_version() -> str:
    """This Python's ``X.Y``: the environment must be made from the same, as the app imports from it."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def frozen() -> bool:
    """Whether this is the bundled app (PyInstaller), which has no Python of its own to run child jobs with."""
    return bool(getattr(sys, "frozen", False))


def app_source_folder() -> Path:
    """The folder holding the app's ``desktop`` package as files (the bundle carries them for the child jobs)."""
    if frozen():
        return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / "app-source"
    return Path(__file__).resolve().parents[3]


def job_file(module: ModuleType) -> Path:
    """The file of one of the app's job modules, to run by path with :func:`local_python`.

    In the bundle it is the copy in the app's sources: the module itself lives in the bundle's archive.
    """
    if not frozen():
        return Path(str(module.__file__))
    return app_source_folder().joinpath(*module.__name__.split(".")).with_suffix(".py")


def local_python() -> Path:
    """The Python that runs the heavy child jobs: the environment's once it is complete, else this one.

    Raises:
        LocalToolError: This is the bundled app and the environment is not installed.
    """
    env = tools_env()
    if env.complete():
        _write_app_path(env, app_python_version())
        return env.python
    if frozen():
        raise LocalToolError(
            "the local tools are not installed: install them on the Models page (or with rentune tools install)"
        )
    return Path(sys.executable)


def activate() -> bool:
    """Lets this process import the environment's libraries (behind its own), when the install is complete.

    Returns:
        Whether the environment is in use.
    """
    env = tools_env()
    if not env.complete():
        return False
    folder = str(env.site_packages())
    if folder not in sys.path:
        sys.path.append(folder)
        importlib.invalidate_caches()
    return True


def _write_app_path(env: ToolsEnv, version: str) -> None:
    path_file = env.site_packages(version) / APP_PATH_FILE
    wanted = f"{app_source_folder()}\n"
    try:
        if path_file.read_text(encoding="utf-8") == wanted:
            return
    except OSError:
        pass
    path_file.parent.mkdir(parents=True, exist_ok=True)
    path_file.write_text(wanted, encoding="utf-8")


# -- status and removal --------------------------------------------------------------------------------------------


def tools_status() -> ToolsStatus:
    """What the environment holds now (blocking: it adds up the folder's size)."""
    env = tools_env()
    if not env.folder.exists():
        return ToolsStatus(env.folder, ToolsState.ABSENT)
    made_for = env.marker_python()
    state = ToolsState.PARTIAL if made_for is None else ToolsState.INSTALLED
    if made_for is not None and made_for != app_python_version():
        state = ToolsState.OTHER_PYTHON
    elif made_for is not None and env.marker_requirements() != requirements_digest():
        state = ToolsState.OUTDATED
    packages = _installed_packages(env.site_packages(made_for)) if made_for else {}
    return ToolsStatus(env.folder, state, folder_bytes(env.folder), made_for, packages)


def _installed_packages(site_packages: Path) -> dict[str, str]:
    distributions = metadata.distributions(path=[str(site_packages)])
    found = {_canonical(dist.metadata["Name"] or ""): dist.version for dist in distributions}
    return {name: found[_canonical(name)] for name in LISTED if _canonical(name) in found}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def remove_tools() -> int:
    """Deletes the environment (blocking). Returns the bytes freed.

    Raises:
        LocalToolError: The folder could not be deleted (in use, or permissions).
    """
    env = tools_env()
    if not env.folder.exists():
        return 0
    size = folder_bytes(env.folder)
    try:
        env.marker.unlink(missing_ok=True)  # first: a removal cut short leaves an unfinished install, not a broken one
        shutil.rmtree(env.folder)
    except OSError as exc:
        raise LocalToolError(
            f"could not delete {env.folder} ({exc.strerror or exc}); quit Rentune and any chat or export using it, "
            "then remove it again"
        ) from exc
    return size


# -- installing ------------------------------------------------------------------------------------------------------


def requirements_text() -> str:
    """The locked stack, as shipped with the app."""
    return resource_bytes("local-tools", "requirements.txt").decode("utf-8")


def build_tools_text() -> str:
    """The locked build tools (pip, scikit-build-core, cmake, ninja) llama-cpp-python is built with."""
    return resource_bytes("local-tools", "build-tools.txt").decode("utf-8")


def llama_cmake_args(lean_file: Path, inherited: str = "") -> str:
    """``CMAKE_ARGS`` for building llama-cpp-python here: only the libraries its Python package loads.

    No multimodal library (llava/mtmd, which Rentune never opens) and no ``common`` library (``lean_file``), still
    tuned for this computer's CPU. ``inherited`` (the user's own ``CMAKE_ARGS``, e.g. ``-DGGML_CUDA=on``) comes last,
    so it wins where it sets the same option.
    """
    include = shlex.quote(f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={lean_file.as_posix()}")
    return " ".join(part for part in ("-DLLAVA_BUILD=off", include, inherited.strip()) if part)


def find_links() -> list[str]:
    """Where pip may find files besides PyPI: torch's CPU build page on Linux, nothing elsewhere."""
    configured = os.environ.get(FIND_LINKS_ENV)
    if configured is not None:
        return configured.split()
    return [TORCH_CPU_PAGE] if sys.platform == "linux" else []


async def find_base_python() -> Path:
    """A Python of the app's version to make the environment from.

    Raises:
        LocalToolError: None is found; the message says which version to install.
    """
    override = os.environ.get(PYTHON_ENV)
    if override:
        candidates: list[str] = [override]
    elif not frozen():
        candidates = [getattr(sys, "_base_executable", "") or sys.executable]
    else:
        names = [f"python{app_python_version()}", "python3", "python"]
        candidates = [found for name in names if (found := shutil.which(name))]
    for candidate in candidates:
        if await _python_version(candidate) == app_python_version():
            return Path(candidate)
    raise LocalToolError(
        f"installing the local tools needs Python {app_python_version()} (the version Rentune is built with), and none "
        f"was found; install it (python.org, or brew install python@{app_python_version()}) or set {PYTHON_ENV} to "
        "one, then install again"
    )


async def _python_version(python: str) -> str | None:
    try:
        process = await asyncio.create_subprocess_exec(
            python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=without_secrets(),
        )  # fmt: skip
        output, _ = await process.communicate()
    except OSError:
        return None
    return output.decode().strip() if process.returncode == 0 else None


async def install_tools(progress: Progress, *, links: Sequence[str] | None = None) -> ToolsStatus:
    """Makes (or finishes) the environment and installs the locked stack into it.

    The build tools go in first (llama-cpp-python is built from its source with them, never with build requirements
    pip would fetch unchecked), then the stack, every file checked against its sha256. Progress goes to ``progress``
    as pip reports each package. Cancelling stops pip at once; running it again finishes the install.

    Raises:
        LocalToolError: No suitable Python, not enough disk space, a file that does not match the lock, or pip failed
            (its last lines are in the message).
    """
    env = tools_env()
    base = await find_base_python()
    require_free_space(env.folder.parent, INSTALLED_BYTES, "the local tools")
    if env.marker_python() not in (None, app_python_version()):
        await asyncio.to_thread(remove_tools)  # made for another Python: its packages cannot be imported here
    if not env.python.exists():
        progress(f"making the tools environment from Python {app_python_version()} ({base})", None)
        await _run([str(base), "-m", "venv", str(env.folder)], progress, what="making the tools environment")
    env.marker.unlink(missing_ok=True)
    (env.site_packages() / APP_PATH_FILE).unlink(missing_ok=True)  # pip must see the environment's packages only
    build_tools, requirements = env.folder / "build-tools.txt", env.folder / "requirements.txt"
    build_tools.write_text(build_tools_text(), encoding="utf-8")
    requirements.write_text(requirements_text(), encoding="utf-8")
    lean = env.folder / LEAN_CMAKE
    lean.write_bytes(resource_bytes("local-tools", LEAN_CMAKE))
    # --no-compile: compiling every module of torch and transformers took 37 of pip's 56 s (2 cores); Python compiles
    # the modules the tools import when they first import them.
    pip = [str(env.python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    locked = [*pip, "--require-hashes", "--no-deps", "--no-compile"]
    progress("installing the build tools", None)
    await _run([*locked, "-r", str(build_tools)], progress, what="installing the build tools")
    links_args = [
        argument for link in (find_links() if links is None else links) for argument in ("--find-links", link)
    ]
    command = [*locked, "--no-build-isolation", *links_args, "-r", str(requirements)]
    cmake = {"CMAKE_ARGS": llama_cmake_args(lean, os.environ.get("CMAKE_ARGS", ""))}
    await _run(command, progress, what="installing the local tools", extra_env=cmake)
    _write_app_path(env, app_python_version())
    _write_marker(env)
    progress("the local tools are installed", 1.0)
    activate()
    return await asyncio.to_thread(tools_status)


def requirements_digest() -> str:
    """The sha256 of this app's lock of the local tools (an install records the one it was made from)."""
    return hashlib.sha256(requirements_text().encode()).hexdigest()


def _write_marker(env: ToolsEnv) -> None:
    record = {"python": app_python_version(), "requirements_sha256": requirements_digest(), "installed_at": time.time()}
    env.marker.write_text(json.dumps(record, indent=2), encoding="utf-8")


_PIP_STEPS = (
    (re.compile(r"^\s*Collecting (\S+)"), "getting {0}"),
    (re.compile(r"^\s*Downloading (\S+?)-\d\S* \((.+)\)"), "downloading {0} ({1})"),
    (re.compile(r"^\s*Building wheel for (\S+)"), "building {0} on this computer (this takes minutes)"),
    (re.compile(r"^\s*Installing collected packages"), "installing the packages (this takes a minute)"),
)


def pip_step(line: str) -> str | None:
    """What a line of pip's output says it is doing, in words, or None for other lines."""
    for pattern, words in _PIP_STEPS:
        found = pattern.match(line)
        if found:
            return words.format(*found.groups())
    return None


async def run_python(
    arguments: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    what: str,
) -> str:
    """Runs ``python ARGUMENTS`` with :func:`local_python` in a child process (see :func:`run_program`).

    Raises:
        LocalToolError: The tools are not installed (bundled app), or the child exited non-zero.
    """
    return await run_program([str(local_python()), *arguments], env=env, on_line=on_line, what=what)


def lock_refusal(lines: Sequence[str]) -> str | None:
    """One line for pip refusing a file the lock does not allow, or None when pip failed for another reason."""
    text = "\n".join(lines)
    if "DO NOT MATCH THE HASHES" in text:
        found = re.search(r"DO NOT MATCH THE HASHES.*?\n\s*([A-Za-z0-9_.-]+==\S+)", text, re.DOTALL)
        package = found[1] if found else "a package"
        return (
            f"{package} as downloaded does not match the sha256 in Rentune's lock, so nothing of it was installed or "
            "run: a download was damaged or a package index served another file; try again later, and if it persists "
            "report it (nothing else on this computer changed)"
        )
    missing = re.search(r"No matching distribution found for ([A-Za-z0-9_.+=<>!~-]+)", text)
    if missing:
        return (
            f"Rentune's lock holds no file of {missing[1]} for this computer ({sys.platform} {platform.machine()}, "
            f"Python {app_python_version()}); the local tools are locked for Linux x86-64 (Python 3.11), macOS arm64 "
            "and Windows x86-64 only"
        )
    return None


async def _run(
    command: list[str], progress: Progress, *, what: str, extra_env: Mapping[str, str] | None = None
) -> None:
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        step = pip_step(line)
        if step:
            progress(step, None)

    env = os.environ | {"PIP_NO_INPUT": "1", "PYTHONUNBUFFERED": "1"} | dict(extra_env or {})
    env.pop("PYTHONPATH", None)
    try:
        await run_program(command, env=env, on_line=on_line, what=what)
    except LocalToolError as exc:
        refusal = lock_refusal(lines)
        if refusal is None:
            raise
        raise LocalToolError(f"{what} stopped: {refusal}") from exc
