"""The bundled app (PyInstaller, ``make dist``) as a user gets it: no torch inside, starts offscreen, and the local
tools it installs on demand merge, export to GGUF and chat on the tiny model.

The bundle is built once per test run (under a lock, so parallel workers share it) when it is missing or older than
the sources. The local tools are installed from the pinned requirements into a temporary data folder; PyTorch's and
llama-cpp-python's extra indexes are switched off (they cannot be reached from here), so pip takes torch's CPU wheel
and llama-cpp-python from this machine's package index and cache.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock
from PySide6.QtGui import QImage

from tests.fixtures.adapters import TrainedAdapter
from tests.fixtures.s3_server import S3Server
from tests.local.test_chat import direct_answer
from tests.trial.test_trial_on_the_cpu import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "dist" / "rentune"
SOURCES = ("desktop", "trainer_payload", "resources", "installers", "pyproject.toml")
FORBIDDEN = ("torch", "libtorch", "libcudart", "libcublas", "libcudnn", "nvidia")


def newest_source() -> float:
    """The latest modification time among the files the bundle is built from."""
    newest = 0.0
    for name in SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if "__pycache__" not in p.parts]
        newest = max([newest, *(p.stat().st_mtime for p in files if p.is_file())])
    return newest


def bundle_is_current() -> bool:
    """Whether dist/rentune was built after the last change to its sources."""
    program = BUNDLE / "rentune"
    return program.is_file() and program.stat().st_mtime >= newest_source()


def build_bundle() -> None:
    """Runs ``make dist``, failing with its output."""
    done = subprocess.run(["make", "dist"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"make dist failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    print("\n".join(done.stdout.strip().splitlines()[-3:]))


@pytest.fixture(scope="session")
def bundle() -> Path:
    """dist/rentune/rentune, built by ``make dist`` unless it is newer than every source file."""
    (ROOT / "build").mkdir(exist_ok=True)
    with FileLock(str(ROOT / "build" / "dist.lock")):
        if not bundle_is_current():
            build_bundle()
    return BUNDLE / "rentune"


@pytest.fixture
def home(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment a user's bundled app runs in: its own data folder, offscreen Qt, no test keyring."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {"RENTUNE_HOME": str(tmp_path / "home"), "QT_QPA_PLATFORM": "offscreen", "RENTUNE_TOOLS_FIND_LINKS": ""}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    yield env


def rentune(bundle: Path, env: dict[str, str], *args: str, timeout: float = 900) -> str:
    """Runs the bundled ``rentune`` and returns its stdout, failing with its output when it exits non-zero."""
    done = subprocess.run([str(bundle), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"rentune {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_bundle_holds_no_torch_and_no_cuda(bundle: Path) -> None:
    found = [p for p in bundle.parent.rglob("*") if p.name.split(".")[0] in FORBIDDEN]
    assert found == [], "the local tools are installed on demand, never bundled"
    size = sum(p.stat().st_size for p in bundle.parent.rglob("*") if p.is_file())
    assert size < 400e6, f"the bundle is {size / 1e6:.0f} MB"


def test_the_bundled_app_checks_a_bucket_with_the_s3_models_it_keeps(
    bundle: Path, home: dict[str, str], s3_server: S3Server
) -> None:
    """The bundle keeps botocore's S3 and STS models only (rentune.spec): S3 must still work from it."""
    keys = {"RENTUNE_BUCKET_KEY_ID": s3_server.access_key, "RENTUNE_BUCKET_SECRET": s3_server.secret_key}
    rentune(bundle, home, "storage", "set", f"s3://{s3_server.bucket}/team", "--endpoint", s3_server.endpoint)
    out = rentune(bundle, home | keys, "storage", "check")
    assert out.startswith(
        f"the bucket works: wrote, read back and deleted a test object in s3://{s3_server.bucket}/team"
    )
    assert not (bundle.parent / "_internal" / "botocore" / "data" / "ec2").exists(), "the other services stay out"


@pytest.mark.parametrize("page", ["home", "data"])
def test_the_bundle_renders_the_main_window_and_the_wizard_offscreen(
    bundle: Path, home: dict[str, str], tmp_path: Path, page: str
) -> None:
    picture = tmp_path / f"{page}.png"
    rentune(bundle, home, "--screenshot", str(picture), "--page", page, timeout=120)
    image = QImage(str(picture))
    assert image.width() >= 1000 and image.height() >= 600
    colours = {image.pixel(x, y) for x in range(0, image.width(), 37) for y in range(0, image.height(), 23)}
    assert len(colours) > 20, "the window is drawn, not blank"


def test_tools_installed_on_demand_merge_export_gguf_and_chat_through_the_bundle(
    bundle: Path, home: dict[str, str], tmp_path: Path, gguf_pattern_adapter: TrainedAdapter
) -> None:
    before = json.loads(rentune(bundle, home, "tools", "status", "--json"))
    assert before["state"] == "absent"
    rentune(bundle, home, "tools", "install", timeout=1500)
    status = json.loads(rentune(bundle, home, "tools", "status", "--json"))
    assert status["state"] == "installed" and status["packages"]["torch"].startswith("2.13.0")
    assert Path(status["folder"]).is_relative_to(Path(home["RENTUNE_HOME"])) and status["size_bytes"] > 300e6

    out = tmp_path / "export"
    adapter, base = str(gguf_pattern_adapter.path), str(gguf_pattern_adapter.base)
    written = json.loads(rentune(bundle, home, "export", adapter, "--base", base, "--merge", "--gguf", "Q8_0",
                                 "--out", str(out), "--json"))  # fmt: skip
    gguf = out / "model-Q8_0.gguf"
    assert gguf.read_bytes()[:4] == b"GGUF" and (out / "merged" / "config.json").is_file(), written

    question, answer = gguf_pattern_adapter.pattern[0]
    said = rentune(bundle, home, "chat", str(gguf), "--prompt", question, "--temperature", "0", "--max-tokens", "24")
    expected = direct_answer(gguf, [{"role": "user", "content": question}], 24)
    assert said.strip() == expected.strip() and answer in said, "the fine-tune answers as llama.cpp does, as trained"

    # the tools hold the payload's trainer: a trial on the CPU trains from the bundle
    spec = write_spec(tmp_path / "trial", base, rows=40, eval_rows=0)
    trial = json.loads(rentune(bundle, home, "trial", str(spec), "--on", "cpu", "--steps", "20", "--json"))
    assert trial["backend"] == "cpu" and trial["steps"] == 20 and trial["answers"], trial

    removed = rentune(bundle, home, "tools", "remove")
    assert removed.startswith("Removed the local tools: ") and "freed" in removed
    assert json.loads(rentune(bundle, home, "tools", "status", "--json"))["state"] == "absent"
