from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pip
import pytest

from tests.payload.conftest import written_events
from trainer_payload.bootstrap import (
    INSTALL_FILE_NAME,
    bootstrap,
    cached_bytes,
    install_command,
    kept_distributions,
    pinned_requirements,
)
from trainer_payload.failures import hint
from trainer_payload.lock import Locked, read_lock, to_install
from trainer_payload.protocol import VENV_DIR, VENV_PYTHON, ErrorKind, EventKind, JobState

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: A small pure-Python package, pinned, that the test environment does not have: installed from PyPI for real.
SMALL_PIN = ("text-unidecode", "1.3")
#: The sha256 of its only file on PyPI (text_unidecode-1.3-py2.py3-none-any.whl).
SMALL_PIN_SHA256 = "1311f10e8b895935241623731c2ba64f4c455287888b18189350b67134a822e8"


def test_requirements_are_pinned_and_never_include_torch() -> None:
    pins = pinned_requirements()
    names = {name.lower() for name, _ in pins}
    assert {"transformers", "peft", "trl", "accelerate", "bitsandbytes"} <= names
    assert "torch" not in names


def test_the_lock_holds_every_pin_with_hashes_and_no_torch_stack() -> None:
    entries = {entry.name: entry for entry in read_lock()}
    for name, version in pinned_requirements():
        entry = entries[name.lower().replace("_", "-")]
        assert entry.version == version and "--hash=sha256:" in entry.entry, name
    assert not [name for name in entries if name.startswith(("torch", "nvidia-", "triton"))], "the image's, never ours"


def test_the_test_environment_needs_nothing_and_a_missing_package_is_listed() -> None:
    assert to_install(read_lock(), kept_distributions()) == []
    absent = Locked("surely-not-installed-pkg", "1.0", "", "surely-not-installed-pkg==1.0 --hash=sha256:00")
    elsewhere = Locked("pywin32", "311", "sys_platform == 'win32'", "pywin32==311 ; sys_platform == 'win32'")
    assert to_install([absent, elsewhere], set()) == [absent]


def test_the_images_torch_stack_stays_as_it_is_even_at_another_version() -> None:
    kept = kept_distributions()
    assert {"torch", "triton"} <= kept and "sympy" in kept, "torch's own requirements are the image's"
    older = Locked("sympy", "0.1", "", "sympy==0.1 --hash=sha256:00")
    assert to_install([older], kept) == [], "the image's sympy is kept"
    assert to_install([older], set()) == [older]


def test_install_checks_every_file_and_pulls_in_nothing(tmp_path: Path) -> None:
    command = install_command(tmp_path / "pip-install.txt")
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert "--require-hashes" in command and "--no-deps" in command
    assert command[-2:] == ["-r", str(tmp_path / "pip-install.txt")]


def test_bootstrap_on_a_ready_machine_reports_and_is_quick(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "job.json").write_text(
        json.dumps({"base_model": "model", "train_file": "t.jsonl", "output_dir": "out"})
    )
    assert bootstrap(tmp_path / "job.json") == 0
    events = written_events(tmp_path / "out" / "events.jsonl")
    states = [e["state"] for e in events if e["event"] is EventKind.STATE]
    assert states == ["installing", "downloading", "preparing"]
    assert events[0]["missing"] == [] and events[0]["torch"]
    assert events[-1]["detail"] == "machine ready" and events[-1]["ready"] is True


def test_hub_cache_progress_counts_files_still_being_written(tmp_path: Path) -> None:
    blobs = tmp_path / "models--org--name" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "aaa").write_bytes(b"x" * 1000)
    (blobs / "bbb.incomplete").write_bytes(b"x" * 234)
    assert cached_bytes("org/name", tmp_path) == 1234
    assert cached_bytes("org/other", tmp_path) == 0


# -- the real install path, as the machine runs it -------------------------------------------------------------------


def make_job_folder(folder: Path, entries: list[str], **job: object) -> tuple[Path, Path]:
    """A run folder with a local model (no download) and a lock file of ``entries``; returns (job.json, lock)."""
    (folder / "model").mkdir(parents=True)
    job_path = folder / "job.json"
    job_path.write_text(json.dumps({"base_model": "model", "train_file": "t.jsonl", "output_dir": "out", **job}))
    lock = folder / "requirements-lock.txt"
    lock.write_text("".join(f"{entry}\n" for entry in entries))
    return job_path, lock


def small_pin(sha256: str = SMALL_PIN_SHA256) -> str:
    """The small package's lock entry (with its real hash unless told otherwise)."""
    name, version = SMALL_PIN
    return f"{name}=={version} --hash=sha256:{sha256}"


def run_bootstrap(
    job: Path, requirements: Path, python: Path | str = sys.executable, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m trainer_payload bootstrap`` with ``python`` (this interpreter unless told) as the machine's Python
    (cwd: the run folder).

    pip sees no local configuration, as on a fresh machine: packages come from PyPI.
    """
    fresh_pip = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    return subprocess.run(
        [str(python), "-m", "trainer_payload", "bootstrap", job.name, "--lock", str(requirements)],
        cwd=job.parent,
        env=fresh_pip | {"PYTHONPATH": str(PACKAGE_ROOT)} | env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def in_run_venv(job: Path, code: str) -> str:
    python = job.parent / VENV_PYTHON
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout


TORCH_OF = "import importlib.metadata as m, torch; print(m.version('torch'), torch.__file__)"


@pytest.mark.slow
def test_bootstrap_installs_a_missing_pin_from_the_index_into_the_run_venv_and_keeps_torch(tmp_path: Path) -> None:
    name, version = SMALL_PIN
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version(name)
    job, requirements = make_job_folder(tmp_path / "run", [small_pin()])
    result = run_bootstrap(job, requirements)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = written_events(job.parent / "out" / "events.jsonl")
    steps = [e.get("step") for e in events if e["event"] is EventKind.STATE and e["state"] == JobState.INSTALLING]
    assert steps[:3] == ["environment", "check", "packages"]
    assert any(e.get("detail", "").startswith(f"Collecting {name}") for e in events), "pip's steps are reported"
    assert events[-1]["ready"] is True
    installed = in_run_venv(job, f"import importlib.metadata as m, text_unidecode; print(m.version('{name}'))")
    assert installed.strip() == version
    assert not list((job.parent / VENV_DIR).rglob("torch/__init__.py")), "no torch of its own in the venv"
    import torch

    assert in_run_venv(job, TORCH_OF).split() == [importlib.metadata.version("torch"), torch.__file__]
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version(name)  # the machine's own Python was not installed into
    assert (job.parent / "out" / INSTALL_FILE_NAME).read_text() == small_pin() + "\n", "exactly the locked entry"


@pytest.mark.slow
def test_a_file_whose_hash_differs_from_the_lock_stops_the_install_in_one_line_and_installs_nothing(
    tmp_path: Path,
) -> None:
    name, version = SMALL_PIN
    job, lock = make_job_folder(tmp_path / "run", [small_pin("0" * 64)])
    result = run_bootstrap(job, lock)
    assert result.returncode == 1
    error = written_events(job.parent / "out" / "events.jsonl")[-1]
    assert (error["event"], error["kind"]) == ("error", "install")
    assert error["message"] == (
        f"{name}=={version} as downloaded does not match the sha256 in the payload's lock, so nothing of it was "
        "installed or run (a damaged download, or an index serving another file)"
    )
    assert not list((job.parent / VENV_DIR).rglob("text_unidecode*")), "nothing of it in the run's venv"


def write_wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    """A minimal pure-Python wheel (metadata only) that pip can install from ``--find-links``."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)
        ),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


@pytest.mark.slow
def test_a_pin_that_wants_another_torch_fails_as_an_install_error_instead_of_replacing_it(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "torch", "999.0", [])  # a "newer torch" the index would offer
    write_wheel(wheels, "rentune-wants-new-torch", "1.0", ["torch>=999"])
    digest = hashlib.sha256((wheels / "rentune_wants_new_torch-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    job, requirements = make_job_folder(tmp_path / "run", [f"rentune-wants-new-torch==1.0 --hash=sha256:{digest}"])
    result = run_bootstrap(job, requirements, PIP_FIND_LINKS=str(wheels), PIP_NO_INDEX="1")
    assert result.returncode == 1
    error = written_events(job.parent / "out" / "events.jsonl")[-1]
    assert (error["event"], error["kind"]) == ("error", "install")
    assert "rentune-wants-new-torch" in error["message"] and "torch" in error["message"]
    import torch

    assert in_run_venv(job, TORCH_OF).split() == [importlib.metadata.version("torch"), torch.__file__]


@pytest.mark.slow
def test_a_failing_pip_is_an_install_error_with_its_last_lines_and_a_hint(tmp_path: Path) -> None:
    job, requirements = make_job_folder(tmp_path / "run", [f"rentune-no-such-package==1.0 --hash=sha256:{'1' * 64}"])
    result = run_bootstrap(job, requirements)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    events = written_events(job.parent / "out" / "events.jsonl")
    error = events[-1]
    assert (error["event"], error["kind"]) == ("error", "install")
    assert "rentune-no-such-package" in error["message"]
    assert "No matching distribution found for rentune-no-such-package==1.0" in error["message"], "pip's own words"
    assert error["hint"] == hint(ErrorKind.INSTALL)
    assert not any(e.get("ready") for e in events)


def test_a_job_with_a_wrong_type_is_a_config_error_before_anything_is_installed(tmp_path: Path) -> None:
    job, requirements = make_job_folder(tmp_path / "run", [small_pin("1" * 64)], lora_r="16")
    result = run_bootstrap(job, requirements)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error = written_events(job.parent / "out" / "events.jsonl")[0]
    assert (error["event"], error["kind"]) == ("error", "config") and "lora_r" in error["message"]
    assert not (job.parent / VENV_DIR).exists()


# -- a bare image: the machine's Python has pip and nothing else -----------------------------------------------------


def bare_python(venv: Path) -> Path:
    """A virtual environment holding pip and nothing else, as a bare image's Python has; its Python.

    The pip is this environment's own, linked in: ensurepip would take longer than the rest of the test.

    Raises:
        AssertionError: ``packaging`` is importable there after all (the test would prove nothing).
    """
    command = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    site_packages(venv).joinpath("pip").symlink_to(Path(pip.__file__).parent, target_is_directory=True)
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import pip, packaging"], capture_output=True, text=True, check=False)
    assert "No module named 'packaging'" in probe.stderr, "pip, and no packaging"
    return python


def site_packages(venv: Path) -> Path:
    """Where a virtual environment of this Python keeps its packages."""
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def installed_metadata(folder: Path, name: str, version: str) -> None:
    """An installed distribution as ``importlib.metadata`` and pip see it (its metadata alone)."""
    dist_info = folder / f"{name}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def hashed_entry(wheels: Path, name: str, version: str, marker: str) -> str:
    """The lock entry of a wheel written by :func:`write_wheel`, with its marker and its file's sha256."""
    digest = hashlib.sha256((wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").read_bytes()).hexdigest()
    return f"{name}=={version} ; {marker} --hash=sha256:{digest}"


@pytest.mark.slow
def test_a_python_with_only_pip_reads_the_lock_installs_and_checks_torch(tmp_path: Path) -> None:
    """The first launch on a provider's default Python failed at the lock's first marker: pip's own ``packaging``
    was used without importing its submodules.

    The bare environment stands where the bootstrap makes the run's environment, so the bootstrap runs in it
    directly what it runs there (the lock's markers, pip, the torch check); its first phase would base the
    environment on this test's own Python, whose packages include ``packaging``. pip installs from a local folder:
    nothing comes from the network.
    """
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "rentune-bare-probe", "1.0", ['torch>=2.0 ; python_version >= "3"'])
    job, lock = make_job_folder(
        tmp_path / "run",
        [
            hashed_entry(wheels, "rentune-bare-probe", "1.0", 'python_version >= "3.8"'),
            f"rentune-windows-only==1.0 ; sys_platform == 'win32' --hash=sha256:{'0' * 64}",  # in no folder
        ],
    )
    python = bare_python(job.parent / VENV_DIR)
    installed_metadata(site_packages(job.parent / VENV_DIR), "torch", "2.5.0")  # the image's torch
    result = run_bootstrap(job, lock, python, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    events = written_events(job.parent / "out" / "events.jsonl")
    assert [e["message"] for e in events if e["event"] is EventKind.ERROR] == [], result.stderr[-2000:]
    assert result.returncode == 0 and events[-1]["ready"] is True
    check = next(e for e in events if e.get("step") == "check")
    assert (check["missing"], check["torch"]) == (["rentune-bare-probe==1.0"], "2.5.0"), "win32's entry left out"
    installed = in_run_venv(job, "import importlib.metadata as m; print(m.version('rentune-bare-probe'))")
    assert installed.strip() == "1.0"
