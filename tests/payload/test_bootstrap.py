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

import pytest

from tests.payload.conftest import written_events
from trainer_payload.bootstrap import (
    CONSTRAINTS_FILE_NAME,
    bootstrap,
    cached_bytes,
    install_command,
    kept_distributions,
    missing_requirements,
    pinned_requirements,
    write_constraints,
)
from trainer_payload.failures import hint
from trainer_payload.protocol import VENV_DIR, VENV_PYTHON, ErrorKind, EventKind, JobState

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: A small pure-Python package, pinned, that the test environment does not have: installed from PyPI for real.
SMALL_PIN = ("text-unidecode", "1.3")


def test_requirements_are_pinned_and_never_include_torch() -> None:
    pins = pinned_requirements()
    names = {name.lower() for name, _ in pins}
    assert {"transformers", "peft", "trl", "accelerate", "bitsandbytes"} <= names
    assert "torch" not in names


def test_test_environment_has_every_pinned_package() -> None:
    assert missing_requirements(pinned_requirements()) == []
    assert missing_requirements([("surely-not-installed-pkg", "1.0")]) == ["surely-not-installed-pkg==1.0"]


def test_install_uses_this_interpreter_under_the_constraints(tmp_path: Path) -> None:
    command = install_command(["x==1"], tmp_path / "c.txt")
    assert command[:4] == [sys.executable, "-m", "pip", "install"] and command[-1] == "x==1"
    assert command[command.index("--constraint") + 1] == str(tmp_path / "c.txt")


def test_constraints_pin_the_images_torch_stack_at_its_installed_versions(tmp_path: Path) -> None:
    kept = kept_distributions()
    assert f"torch=={importlib.metadata.version('torch')}" in kept
    nvidia = {d.metadata["Name"].lower() for d in importlib.metadata.distributions() if d.metadata["Name"]}
    assert {spec.split("==")[0] for spec in kept} >= {n.replace("_", "-") for n in nvidia if n.startswith("nvidia")}
    assert write_constraints(tmp_path / "c.txt").read_text().splitlines() == kept


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


def make_job_folder(folder: Path, pins: list[str], **job: object) -> tuple[Path, Path]:
    """A run folder with a local model (no download) and a requirements file; returns (job.json, requirements)."""
    (folder / "model").mkdir(parents=True)
    job_path = folder / "job.json"
    job_path.write_text(json.dumps({"base_model": "model", "train_file": "t.jsonl", "output_dir": "out", **job}))
    requirements = folder / "requirements.txt"
    requirements.write_text("".join(f"{pin}\n" for pin in pins))
    return job_path, requirements


def run_bootstrap(job: Path, requirements: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m trainer_payload bootstrap`` with this interpreter as the machine's Python (cwd: the run folder).

    pip sees no local configuration, as on a fresh machine: packages come from PyPI.
    """
    fresh_pip = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    return subprocess.run(
        [sys.executable, "-m", "trainer_payload", "bootstrap", job.name, "--requirements", str(requirements)],
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
    job, requirements = make_job_folder(tmp_path / "run", [f"{name}=={version}"])
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
    constraints = (job.parent / "out" / CONSTRAINTS_FILE_NAME).read_text()
    assert f"torch=={importlib.metadata.version('torch')}" in constraints.splitlines()


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
    job, requirements = make_job_folder(tmp_path / "run", ["rentune-wants-new-torch==1.0"])
    result = run_bootstrap(job, requirements, PIP_FIND_LINKS=str(wheels), PIP_NO_INDEX="1")
    assert result.returncode == 1
    error = written_events(job.parent / "out" / "events.jsonl")[-1]
    assert (error["event"], error["kind"]) == ("error", "install")
    assert "rentune-wants-new-torch" in error["message"] and "torch" in error["message"]
    import torch

    assert in_run_venv(job, TORCH_OF).split() == [importlib.metadata.version("torch"), torch.__file__]


@pytest.mark.slow
def test_a_failing_pip_is_an_install_error_with_its_last_lines_and_a_hint(tmp_path: Path) -> None:
    job, requirements = make_job_folder(tmp_path / "run", ["rentune-no-such-package==1.0"])
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
    job, requirements = make_job_folder(tmp_path / "run", ["rentune-no-such-package==1.0"], lora_r="16")
    result = run_bootstrap(job, requirements)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error = written_events(job.parent / "out" / "events.jsonl")[0]
    assert (error["event"], error["kind"]) == ("error", "config") and "lora_r" in error["message"]
    assert not (job.parent / VENV_DIR).exists()
