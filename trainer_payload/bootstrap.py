"""``python -m trainer_payload bootstrap job.json``: make a stock PyTorch CUDA image ready to train, fast.

The app starts it detached and follows its ``state`` events (``installing`` step by step, ``downloading`` with bytes,
then ``preparing`` with ``ready: true``) or its ``error`` event. It runs in two phases in one process:

1. With the machine's Python, it creates the run's virtual environment (:data:`~trainer_payload.protocol.VENV_DIR`
   next to ``job.json``) over that Python with its site-packages visible, so the image's torch is used as it is and
   an externally managed system Python (PEP 668) is never installed into; then it re-runs itself with the venv's
   Python.
2. In the venv, it installs only the locked packages that are missing (:mod:`trainer_payload.lock`: every file's
   sha256, ``pip --require-hashes --no-deps``, so pip takes exactly those files and never touches the image's torch
   and CUDA libraries, which the lock leaves out), checks that what it installed accepts the image's torch, and
   downloads the model in parallel with the install.
"""

from __future__ import annotations

import collections
import fnmatch
import importlib
import importlib.metadata
import os
import re
import shutil
import site
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainer_payload.failures import classify, config_error, hint
from trainer_payload.lock import LOCK, Locked, applies, canonical, job_entries, to_install, torch_conflicts
from trainer_payload.protocol import (
    EVENTS_FILE_NAME,
    VENV_DIR,
    ErrorKind,
    EventKind,
    EventWriter,
    JobSpec,
    JobSpecError,
    JobState,
)

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
NEVER_INSTALL = {"torch", "torchvision", "torchaudio"}
#: The image's own builds: pinned at their installed versions (with every ``nvidia-*`` library) for every install.
KEPT_DISTRIBUTIONS = ("torch", "torchvision", "torchaudio", "triton")
#: The lock entries one pip run installs, written in the run's output folder (kept for the log).
INSTALL_FILE_NAME = "pip-install.txt"
LAYER_PTH_NAME = "rentune-base-site.pth"
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
EXIT_READY, EXIT_FAILED = 0, 1
#: Lines of pip's output an install error carries.
PIP_TAIL_LINES = 12
#: Seconds between two ``downloading`` progress events.
PROGRESS_SECONDS = 5.0


def pinned_requirements(path: Path = REQUIREMENTS) -> list[tuple[str, str]]:
    """(name, version) pairs of ``requirements.txt`` (what the lock is made from), torch excluded."""
    pins = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            if name.lower() not in NEVER_INSTALL:
                pins.append((name, version))
    return pins


def machine_facts() -> dict[str, Any]:
    """GPU driver and the image's torch, without changing anything."""
    facts: dict[str, Any] = {"python": sys.version.split()[0]}
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        result = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
        facts["gpus"] = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    try:
        facts["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        facts["torch"] = None
    return facts


def kept_distributions() -> set[str]:
    """Canonical names of the image's torch stack, kept as the image has them when present.

    torch, torchvision, torchaudio, triton, every ``nvidia-*`` library and what torch itself requires.
    """
    kept = set(KEPT_DISTRIBUTIONS)
    for dist in importlib.metadata.distributions():
        name = canonical(str(dist.metadata["Name"] or ""))
        if name.startswith("nvidia-"):
            kept.add(name)
    try:
        requires = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    kept.update(canonical(re.split(r"[\s;<>=!~\[(]", line, maxsplit=1)[0]) for line in requires)
    return kept


def install_command(requirements_file: Path) -> list[str]:
    """The pip command installing the lock entries of ``requirements_file`` here, each file checked by its sha256.

    Nothing else is pulled in (``--no-deps``): the lock holds every package the trainer needs. ``--no-compile``: pip
    would compile every module of every package it installs (transformers alone has thousands) while the machine bills;
    Python compiles the few the trainer imports when it first imports them.

    pip, not uv: uv does not count the packages a ``--system-site-packages`` venv sees as installed
    (astral-sh/uv#7358), so it would download a second torch into the venv instead of keeping the image's.
    """
    return [
        sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
        "--require-hashes", "--no-deps", "--no-compile", "-r", str(requirements_file),
    ]  # fmt: skip


# -- phase 1: the run's venv over the machine's Python ---------------------------------------------------------


def venv_of(job_path: Path) -> Path:
    """The run's virtual environment: :data:`VENV_DIR` in the folder of ``job.json``."""
    return job_path.resolve().parent / VENV_DIR


def in_venv_of(job_path: Path) -> bool:
    """Whether this interpreter is the run's venv (the bootstrap's second phase)."""
    return Path(sys.prefix).resolve() == venv_of(job_path).resolve()


def create_venv(venv: Path) -> Path:
    """Creates (or keeps) a venv over this interpreter that sees its packages; returns the venv's Python.

    ``--system-site-packages`` keeps the image's torch visible; the venv has no pip of its own, the interpreter's
    is used (so a Python without ``ensurepip`` works too). ``venv`` bases a venv made from inside another venv on the
    base Python, so in that case this venv's site-packages are added with a ``.pth`` file.

    Raises:
        subprocess.CalledProcessError: ``venv`` failed (its output is in ``stdout``).
    """
    command = [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)]
    subprocess.run(command, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    if sys.prefix != sys.base_prefix:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        layer = venv / "lib" / version / "site-packages" / LAYER_PTH_NAME
        layer.write_text("".join(f"{path}\n" for path in site.getsitepackages()), encoding="utf-8")
    return venv / "bin" / "python"


def enter_venv(job_path: Path, lock: Path = LOCK) -> int:
    """Creates the run's venv and continues the bootstrap in it, in this same process (the app follows its pid).

    Returns:
        The exit code, only when the venv could not be made (otherwise this process becomes the venv's Python).
    """
    spec = _load(job_path)
    if isinstance(spec, int):
        return spec
    events = EventWriter(Path(spec.output_dir) / EVENTS_FILE_NAME)
    venv = venv_of(job_path)
    detail = f"creating the environment {VENV_DIR} over Python {sys.version.split()[0]} ({sys.executable})"
    events.emit(EventKind.STATE, state=JobState.INSTALLING.value, step="environment", detail=detail)
    try:
        python = create_venv(venv)
    except subprocess.CalledProcessError as exc:
        _install_failed(events, f"creating {venv}", str(exc.stdout) + str(exc.stderr))
        return EXIT_FAILED
    package_root = str(Path(__file__).resolve().parent.parent)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    arguments = ["-m", "trainer_payload", "bootstrap", str(job_path.resolve()), "--lock", str(lock)]
    sys.stdout.flush()
    try:
        os.execve(python, [str(python), *arguments], env)  # noqa: S606 - our own venv's Python, fixed arguments
    except OSError as exc:
        _install_failed(events, f"starting {python}", str(exc))
    return EXIT_FAILED


# -- phase 2: install what is missing and download the model -----------------------------------------------------


def bootstrap(job_path: Path, *, dry_run: bool = False, lock: Path = LOCK) -> int:
    """Installs what this interpreter lacks and downloads the model; returns the exit code (0 when ready).

    Every failure ends as an ``error`` event: ``config`` for a bad job file (exit 2), ``install`` when pip fails,
    ``download`` when the model cannot be fetched.
    """
    spec = _load(job_path)
    if isinstance(spec, int):
        return spec
    events = EventWriter(Path(spec.output_dir) / EVENTS_FILE_NAME)
    try:
        return _prepare(spec, events, lock, dry_run=dry_run)
    except Exception as exc:  # noqa: BLE001 - every failure must become an error event, never a silent crash
        kind = classify(exc)
        events.emit(EventKind.ERROR, kind=kind.value, message=f"{type(exc).__name__}: {exc}"[:2000], hint=hint(kind))
        return EXIT_FAILED


def _load(job_path: Path) -> JobSpec | int:
    """The job, or the exit code after its ``config`` error event."""
    try:
        return JobSpec.load(job_path)
    except JobSpecError as exc:
        return config_error(job_path, str(exc))


def _prepare(spec: JobSpec, events: EventWriter, lock: Path, *, dry_run: bool) -> int:
    entries = [entry for entry in job_entries(lock, spec.report_to) if applies(entry)]
    needed = to_install(entries, kept_distributions())
    missing = [f"{entry.name}=={entry.version}" for entry in needed]
    detail = f"{len(needed)} of {len(entries)} locked packages to install" if needed else "every package is installed"
    facts = machine_facts()
    events.emit(
        EventKind.STATE, state=JobState.INSTALLING.value, step="check", detail=detail, missing=missing,
        dry_run=dry_run, **facts,
    )  # fmt: skip
    if dry_run:
        return EXIT_READY
    started, folder = time.monotonic(), Path(spec.output_dir)
    hub_first = [entry for entry in needed if entry.name == "huggingface-hub"]  # the download needs it
    if hub_first and not _install(hub_first, folder, events):
        return EXIT_FAILED
    download = _Download(spec.base_model) if not Path(spec.base_model).exists() else None
    rest = [entry for entry in needed if entry not in hub_first]
    if rest and not _install(rest, folder, events):
        return EXIT_FAILED
    conflicts = torch_conflicts(entries, facts.get("torch"))
    if conflicts:
        what = f"the installed packages need another torch than the image's torch {facts.get('torch')}"
        _install_failed(events, what, "\n".join(conflicts) + "; choose an image with a torch they accept")
        return EXIT_FAILED
    install_seconds = round(time.monotonic() - started, 2)
    events.emit(
        EventKind.STATE, state=JobState.DOWNLOADING.value, model=spec.base_model, install_seconds=install_seconds
    )
    error = download.wait(events) if download is not None else None
    if error is not None:
        message = f"{type(error).__name__}: {error}"[:2000]
        events.emit(EventKind.ERROR, kind=ErrorKind.DOWNLOAD.value, message=message, hint=hint(ErrorKind.DOWNLOAD))
        return EXIT_FAILED
    ready_seconds = round(time.monotonic() - started, 2)
    events.emit(
        EventKind.STATE, state=JobState.PREPARING.value, detail="machine ready", ready=True, ready_seconds=ready_seconds
    )
    return EXIT_READY


def _install(entries: list[Locked], folder: Path, events: EventWriter) -> bool:
    """Installs lock entries with pip, reporting each package it collects; False (after an error event) on failure."""
    specs = [f"{entry.name}=={entry.version}" for entry in entries]
    events.emit(
        EventKind.STATE, state=JobState.INSTALLING.value, step="packages", detail=f"installing {', '.join(specs)}"
    )
    requirements = folder / INSTALL_FILE_NAME
    requirements.parent.mkdir(parents=True, exist_ok=True)
    requirements.write_text("".join(f"{entry.entry}\n" for entry in entries), encoding="utf-8")
    tail: collections.deque[str] = collections.deque(maxlen=PIP_TAIL_LINES)
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        install_command(requirements), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as pip:
        assert pip.stdout is not None  # set by stdout=PIPE
        output: list[str] = []
        for line in pip.stdout:
            sys.stdout.write(line)  # the whole output stays in the bootstrap's log
            output.append(line)
            tail.append(line.rstrip())
            if line.startswith("Collecting "):
                events.emit(EventKind.STATE, state=JobState.INSTALLING.value, step="packages", detail=line.strip())
    if pip.returncode:
        refused = hash_refusal(output)
        if refused is not None:
            message = (
                f"{refused} as downloaded does not match the sha256 in the payload's lock, so nothing of it was "
                "installed or run (a damaged download, or an index serving another file)"
            )
            events.emit(EventKind.ERROR, kind=ErrorKind.INSTALL.value, message=message, hint=hint(ErrorKind.INSTALL))
            return False
        return _install_failed(events, f"installing {' '.join(specs)}", "\n".join(tail))
    return True


def hash_refusal(output: list[str]) -> str | None:
    """The ``name==version`` pip refused because its file's hash differs from the lock's, or None."""
    text = "".join(output)
    found = re.search(r"DO NOT MATCH THE HASHES.*?\n\s*([A-Za-z0-9_.-]+==[^\s:]+)", text, re.DOTALL)
    if found:
        return found[1]
    return "a package" if "DO NOT MATCH THE HASHES" in text else None


def _install_failed(events: EventWriter, what: str, output: str) -> bool:
    """Reports a failed install step with the last lines of its output."""
    lines = [line for line in output.splitlines() if line.strip()][-PIP_TAIL_LINES:]
    message = f"{what} failed:\n" + "\n".join(lines)[-1800:]
    events.emit(EventKind.ERROR, kind=ErrorKind.INSTALL.value, message=message, hint=hint(ErrorKind.INSTALL))
    return False


class _Download:
    """The model's download from the Hub, in a thread, its progress read from the Hub cache."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            importlib.invalidate_caches()  # huggingface_hub may have been installed a moment ago
            from huggingface_hub import snapshot_download

            snapshot_download(self.model, allow_patterns=MODEL_FILES)
        except Exception as exc:  # noqa: BLE001 - reported as a download error event by wait()
            self.error = exc

    def wait(self, events: EventWriter) -> BaseException | None:
        """Waits for the download, reporting bytes done (and the total when the Hub says); returns its error."""
        total: int | None = None
        self._thread.join(PROGRESS_SECONDS)
        while self._thread.is_alive():
            total = total or expected_bytes(self.model)
            done = cached_bytes(self.model)
            detail = f"downloading {self.model}: {done / 1e9:,.2f}" + (f" of {total / 1e9:,.2f} GB" if total else " GB")
            events.emit(
                EventKind.STATE,
                state=JobState.DOWNLOADING.value,
                model=self.model,
                bytes_done=done,
                bytes_total=total,
                detail=detail,
            )
            self._thread.join(PROGRESS_SECONDS)
        return self.error


def expected_bytes(model: str) -> int | None:
    """Size of the files the download fetches, from the Hub's file listing (None when the Hub does not say)."""
    try:
        from huggingface_hub import HfApi

        siblings = HfApi().model_info(model, files_metadata=True).siblings or []
    except Exception:  # noqa: BLE001 - progress is best effort; the download reports its own errors
        return None
    wanted = [s.size or 0 for s in siblings if any(fnmatch.fnmatch(s.rfilename, p) for p in MODEL_FILES)]
    return sum(wanted) or None


def cached_bytes(model: str, cache: Path | None = None) -> int:
    """Bytes of the model in the Hub cache so far, files still being written (``.incomplete``) included."""
    if cache is None:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
    blobs = cache / ("models--" + model.replace("/", "--")) / "blobs"
    done = 0
    for path in blobs.glob("*"):
        try:
            done += path.stat().st_size
        except FileNotFoundError:  # renamed from .incomplete between the listing and now
            continue
    return done
