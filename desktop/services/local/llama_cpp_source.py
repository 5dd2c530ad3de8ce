"""llama.cpp's own GGUF converters, pinned to the installed llama-cpp-python and cached on first use.

The converters are not a package on PyPI, but llama-cpp-python's source distribution carries them with the
``gguf-py`` they are written against (PyPI's ``gguf`` lags behind). The first use downloads that sdist from the
package index (PyPI's JSON simple API, ``$RENTUNE_PYPI_URL`` to override), checks it against the sha256 pinned in
``resources/local-tools/llama-cpp-sources.json`` before anything in it is unpacked or run, keeps only the converters,
their ``conversion`` package and ``gguf-py``, and caches them per version; later uses read the cache only. A file lock
keeps parallel processes from building the same cache at once.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
from filelock import FileLock, Timeout

from desktop.services.local.common import LocalToolError, Progress, partial_name
from desktop.services.local.toolenv import run_python
from desktop.services.platform.files import sha256_file
from desktop.services.platform.paths import app_paths
from desktop.services.platform.resources import resource_bytes

CACHE_ENV = "RENTUNE_TOOLS_CACHE"
INDEX_ENV = "RENTUNE_PYPI_URL"
DEFAULT_INDEX = "https://pypi.org/simple"
_PACKAGE = "llama-cpp-python"
_VENDOR = "vendor/llama.cpp"
_KEPT = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/")
#: What building llama.cpp's library needs from the same source: the CPU backend only (a rented machine builds it
#: with a small quantise tool to write K-quants after training), never the GPU backends, `common` nor the tools.
_BUILD_KEPT = (
    "CMakeLists.txt",
    "LICENSE",
    "cmake/",
    "ggml/",
    "include/",
    "licenses/",
    "src/",
    "vendor/",
)
_GPU_BACKENDS = (
    "cann", "cuda", "et", "hexagon", "hip", "metal", "musa", "opencl", "openvino", "sycl", "virtgpu", "vulkan",
    "webgpu", "zdnn", "zendnn",
)  # fmt: skip
_BUILD_LEFT_OUT = tuple(f"ggml/src/ggml-{backend}/" for backend in _GPU_BACKENDS)

# Runs in a child process: extracts the kept files (not those left out) of the sdist's vendor/llama.cpp into a folder.
_EXTRACT = """
import sys, tarfile
from pathlib import Path
archive, out, vendor = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
rest = sys.argv[4:]
split = rest.index("--without") if "--without" in rest else len(rest)
kept, left_out = tuple(rest[:split]), tuple(rest[split + 1:])
with tarfile.open(archive) as tar:
    for member in tar.getmembers():
        inner = member.name.split("/", 1)[-1]
        if not (member.isfile() and inner.startswith(vendor + "/")):
            continue
        name = inner[len(vendor) + 1:]
        if name.startswith(kept) and not name.startswith(left_out):
            member.name = name
            tar.extract(member, out, filter="data")
"""


@dataclass(frozen=True)
class Converters:
    """llama.cpp's conversion scripts of one version, ready to run.

    Attributes:
        root: The cached folder (``<cache>/llama.cpp-VERSION``).
        convert_hf: ``convert_hf_to_gguf.py``: a Hugging Face model folder to a GGUF file.
        convert_lora: ``convert_lora_to_gguf.py``: a PEFT LoRA adapter to a GGUF LoRA.
        gguf_py: The vendored ``gguf-py`` folder, to put on ``PYTHONPATH`` of the scripts and readers.
        version: The llama-cpp-python version they came from.
    """

    root: Path
    convert_hf: Path
    convert_lora: Path
    gguf_py: Path
    version: str

    def env(self) -> dict[str, str]:
        """This process's environment with the vendored ``gguf-py`` first on ``PYTHONPATH``."""
        paths = [str(self.gguf_py), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def tools_cache() -> Path:
    """Where downloaded tools are cached: ``$RENTUNE_TOOLS_CACHE``, else the app's cache folder's ``tools``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else app_paths().cache_dir / "tools"


def installed_version() -> str:
    """The installed llama-cpp-python's version.

    Raises:
        LocalToolError: llama-cpp-python is not installed.
    """
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise LocalToolError(
            "llama-cpp-python is not installed, so GGUF files cannot be made; install the local tools (Models page, "
            "or rentune tools install)"
        ) from None


def _converters(root: Path, version: str) -> Converters:
    return Converters(root, root / "convert_hf_to_gguf.py", root / "convert_lora_to_gguf.py", root / "gguf-py", version)


#: About how many megabytes the first GGUF step downloads (llama-cpp-python's source, for its converters).
CONVERTERS_DOWNLOAD_MB = 80


def converters_cached() -> bool:
    """Whether llama.cpp's converters for the installed llama-cpp-python are cached (False when it is missing)."""
    try:
        version = installed_version()
    except LocalToolError:
        return False
    return (tools_cache() / f"llama.cpp-{version}").is_dir()


async def llama_cpp_converters(progress: Progress) -> Converters:
    """llama.cpp's converters matching the installed llama-cpp-python, downloaded once and then cached.

    Args:
        progress: Receives the download and extraction steps (only on the first use of a version).

    Raises:
        LocalToolError: llama-cpp-python is not installed, or its source could not be downloaded.
    """
    version = installed_version()
    root = tools_cache() / f"llama.cpp-{version}"
    if not root.is_dir():  # cached: no await at all (a dialog's quick check must not yield here)
        await _cached(root, version, _KEPT, (), progress)
    if not (root / "convert_hf_to_gguf.py").is_file() or not (root / "gguf-py" / "gguf").is_dir():
        raise LocalToolError(f"llama-cpp-python {version}'s source has no convert_hf_to_gguf.py and gguf-py")
    return _converters(root, version)


async def llama_cpp_build_sources(progress: Progress) -> Path:
    """The sources llama.cpp's library is built from (CPU backend only), of the installed version, cached.

    A rented machine builds its quantise tool (``trainer_payload.quantize_tool``) over them to write K-quants
    (Q4_K_M...) after training; the same pinned, hash-checked archive as the converters.

    Raises:
        LocalToolError: llama-cpp-python is not installed, or its source could not be downloaded.
    """
    version = installed_version()
    root = tools_cache() / f"llama.cpp-{version}-library-sources"
    if not root.is_dir():
        await _cached(root, version, _BUILD_KEPT, _BUILD_LEFT_OUT, progress)
    if not (root / "src" / "CMakeLists.txt").is_file() or not (root / "include" / "llama.h").is_file():
        raise LocalToolError(f"llama-cpp-python {version}'s source has no llama library (src/, include/llama.h)")
    return root


async def _cached(
    root: Path, version: str, kept: tuple[str, ...], left_out: tuple[str, ...], progress: Progress
) -> None:
    """Makes ``root`` hold the kept files of ``version``'s source, once (a lock keeps other processes waiting)."""
    await asyncio.to_thread(root.parent.mkdir, parents=True, exist_ok=True)
    lock = FileLock(str(root) + ".lock")
    await _acquire(lock)
    try:
        if not await asyncio.to_thread(root.is_dir):
            await _build(version, root, (*kept, "--without", *left_out), progress)
    finally:
        lock.release()


async def _acquire(lock: FileLock) -> None:
    """Takes ``lock`` without blocking the event loop (another process may be building the same cache)."""
    while True:
        try:
            lock.acquire(timeout=0)
            return
        except Timeout:
            await asyncio.sleep(0.25)


async def _build(version: str, root: Path, selection: tuple[str, ...], progress: Progress) -> None:
    work = partial_name(root)
    try:
        archive = await llama_cpp_source_archive(version, progress)
        progress("unpacking llama.cpp's source", None)
        args = ["-c", _EXTRACT, str(archive), str(work), _VENDOR, *selection]
        await run_python(args, what="unpacking llama-cpp-python's source")
        work.rename(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def llama_cpp_source_archive(version: str, progress: Progress) -> Path:
    """llama-cpp-python ``version``'s pinned source archive, downloaded once into the tools cache, sha256-checked.

    The converters and the library sources are unpacked from the same archive: the second needs no download.

    Raises:
        LocalToolError: Not pinned, not downloadable, or its sha256 differs from the pin.
    """
    pin = source_pin(version)
    folder = tools_cache() / "archives"
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    archive, lock = folder / pin.filename, FileLock(str(folder / pin.filename) + ".lock")
    await _acquire(lock)
    try:
        if await asyncio.to_thread(_intact, archive, pin):
            return archive
        with tempfile.TemporaryDirectory(prefix="rentune-llama-cpp-", dir=folder) as download:
            progress(f"downloading llama.cpp's source (llama-cpp-python {version}, ~80 MB)", None)
            fetched = await _download(version, Path(download))
            fetched.replace(archive)
        return archive
    finally:
        lock.release()


@dataclass(frozen=True)
class SourcePin:
    """The one source archive of a llama-cpp-python version Rentune takes, and its sha256."""

    version: str
    filename: str
    sha256: str


def source_pin(version: str) -> SourcePin:
    """The pinned archive of ``version`` (``resources/local-tools/llama-cpp-sources.json``).

    Raises:
        LocalToolError: No archive of that version is pinned.
    """
    pins = json.loads(resource_bytes("local-tools", "llama-cpp-sources.json"))[_PACKAGE]
    if version not in pins:
        known = ", ".join(sorted(pins))
        raise LocalToolError(
            f"llama-cpp-python {version} is installed, but Rentune knows the source of {known} only; reinstall the "
            "local tools (Models page, or rentune tools install) so their version matches"
        )
    return SourcePin(version, pins[version]["filename"], pins[version]["sha256"])


async def _download(version: str, folder: Path, transport: httpx.AsyncBaseTransport | None = None) -> Path:
    """Downloads the pinned source archive into ``folder`` and checks its sha256; nothing in it is run.

    Raises:
        LocalToolError: Not pinned, not listed by the index, unreachable, or its sha256 differs (the file is deleted).
    """
    pin = source_pin(version)
    index = os.environ.get(INDEX_ENV, DEFAULT_INDEX).rstrip("/")
    try:
        async with httpx.AsyncClient(transport=transport, timeout=60, follow_redirects=True) as client:
            url = await _archive_url(client, index, pin)
            archive = await _fetch(client, url, folder / pin.filename)
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: an answer that is not the index's JSON
        reason = str(exc) or type(exc).__name__
        raise LocalToolError(
            f"could not download llama-cpp-python {version}'s source from the package index {index} ({reason}); "
            "connect to the internet and try again"
        ) from None
    return await asyncio.to_thread(_checked, archive, pin)  # hashing 80 MB stays off the event loop


async def _archive_url(client: httpx.AsyncClient, index: str, pin: SourcePin) -> str:
    answer = await client.get(f"{index}/{_PACKAGE}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    answer.raise_for_status()
    for entry in answer.json().get("files", []):
        if entry.get("filename") == pin.filename:
            return str(httpx.URL(f"{index}/{_PACKAGE}/").join(str(entry["url"])))
    raise LocalToolError(f"the package index {index} does not list {pin.filename}; try again later")


async def _fetch(client: httpx.AsyncClient, url: str, target: Path) -> Path:
    async with client.stream("GET", url) as answer:
        answer.raise_for_status()
        with target.open("wb") as out:
            async for chunk in answer.aiter_bytes(1 << 20):
                out.write(chunk)
    return target


def _intact(archive: Path, pin: SourcePin) -> bool:
    """Whether a cached archive is there with the pinned sha256 (a damaged one is deleted, to be fetched anew)."""
    if not archive.is_file():
        return False
    if sha256_file(archive) == pin.sha256:
        return True
    archive.unlink()
    return False


def _checked(archive: Path, pin: SourcePin) -> Path:
    """``archive`` when its sha256 is the pinned one; else it is deleted and the error names both."""
    digest = sha256_file(archive)
    if digest != pin.sha256:
        archive.unlink()
        raise LocalToolError(
            f"{pin.filename} from the package index has sha256 {digest}, not the pinned {pin.sha256}; "
            "it was deleted unopened. Check the index (RENTUNE_PYPI_URL) and try again"
        )
    return archive


_REGISTER = re.compile(r"@ModelBase\.register\(([^)]*)\)")
_QUOTED = re.compile(r"""["']([^"']+)["']""")


def convertible_architectures(converters: Converters) -> frozenset[str]:
    """The Hugging Face architectures (``config.json``'s ``architectures``) the converter registers.

    Reads the ``@ModelBase.register(...)`` decorators as text; the converter is never imported.
    """
    sources = [converters.convert_hf, *sorted((converters.root / "conversion").glob("*.py"))]
    names: set[str] = set()
    for source in sources:
        for match in _REGISTER.finditer(source.read_text(encoding="utf-8")):
            names.update(_QUOTED.findall(match.group(1)))
    return frozenset(names)
