"""``python -m trainer_payload bootstrap job.json``: make a stock PyTorch CUDA image ready to train, fast.

Checks the driver and the torch already there (never replaces it), installs only the pinned packages that are
missing (uv when available, pip otherwise), and downloads the model in parallel with the install. Each phase is a
``state`` event with its duration.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainer_payload.failures import hint
from trainer_payload.protocol import EVENTS_FILE_NAME, ErrorKind, EventKind, EventWriter, JobState

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
NEVER_INSTALL = {"torch", "torchvision", "torchaudio"}
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def pinned_requirements(path: Path = REQUIREMENTS) -> list[tuple[str, str]]:
    """(name, version) pairs of ``requirements.txt``, torch excluded."""
    pins = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            if name.lower() not in NEVER_INSTALL:
                pins.append((name, version))
    return pins


def missing_requirements(pins: list[tuple[str, str]]) -> list[str]:
    """The ``name==version`` specs not installed at exactly that version."""
    missing = []
    for name, version in pins:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            missing.append(f"{name}=={version}")
    return missing


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


def install_command(specs: list[str]) -> list[str]:
    """Returns the install command: uv when the machine has it (much faster), pip otherwise."""
    if shutil.which("uv"):
        return ["uv", "pip", "install", "--python", sys.executable, *specs]
    return [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", *specs]


def _download(model: str, errors: list[BaseException]) -> None:
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(model, allow_patterns=MODEL_FILES)
    except Exception as exc:  # noqa: BLE001 - reported as a download error event by the caller
        errors.append(exc)


def _needs_download(model: str, job_dir: Path) -> bool:
    return not (Path(model).exists() or (job_dir / model).exists())


def bootstrap(job_path: Path, *, dry_run: bool = False) -> int:
    """Prepares the machine for the job; returns 0 when ready."""
    job = json.loads(job_path.read_text(encoding="utf-8"))
    events = EventWriter((job_path.parent / job.get("output_dir", ".")).resolve() / EVENTS_FILE_NAME)
    missing = missing_requirements(pinned_requirements())
    events.emit(EventKind.STATE, state=JobState.INSTALLING.value, missing=missing, dry_run=dry_run, **machine_facts())
    if dry_run:
        return 0
    started = time.monotonic()
    hub_first = [spec for spec in missing if spec.lower().startswith("huggingface_hub")]
    if hub_first and _run_install(hub_first, events):
        return 1
    errors: list[BaseException] = []
    model = str(job.get("base_model", ""))
    downloader = None
    if model and _needs_download(model, job_path.parent):
        downloader = threading.Thread(target=_download, args=(model, errors), daemon=True)
        downloader.start()
    rest = [spec for spec in missing if spec not in hub_first]
    if rest and _run_install(rest, events):
        return 1
    events.emit(
        EventKind.STATE,
        state=JobState.DOWNLOADING.value,
        model=model,
        install_seconds=round(time.monotonic() - started, 2),
    )
    if downloader is not None:
        downloader.join()
    if errors:
        events.emit(
            EventKind.ERROR,
            kind=ErrorKind.DOWNLOAD.value,
            message=f"{type(errors[0]).__name__}: {errors[0]}"[:2000],
            hint=hint(ErrorKind.DOWNLOAD),
        )
        return 1
    events.emit(
        EventKind.STATE,
        state=JobState.PREPARING.value,
        detail="machine ready",
        ready_seconds=round(time.monotonic() - started, 2),
    )
    return 0


def _run_install(specs: list[str], events: EventWriter) -> int:
    result = subprocess.run(install_command(specs), capture_output=True, text=True, check=False)
    if result.returncode:
        events.emit(
            EventKind.ERROR,
            kind=ErrorKind.INTERNAL.value,
            message=f"installing {' '.join(specs)} failed: {result.stderr[-1500:]}",
            hint="check the machine's network and Python version; the image's torch was left as it was",
        )
    return result.returncode
