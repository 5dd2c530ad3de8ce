"""The local tools' private environment, without installing torch: states, activation, the job Python, removal.

The full install (pip, torch, llama.cpp) runs through the bundled app in tests/installers/test_bundle.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.services.local import quantize_job
from desktop.services.local.common import LocalToolError
from desktop.services.local.toolenv import (
    APP_PATH_FILE,
    LEAN_CMAKE,
    MARKER,
    PYTHON_ENV,
    ToolsState,
    activate,
    app_python_version,
    find_base_python,
    job_file,
    llama_cmake_args,
    local_python,
    pip_step,
    remove_tools,
    requirements_digest,
    run_python,
    tools_env,
    tools_status,
)


def fake_installed(version: str | None = None, lock_sha256: str | None = None) -> Path:
    """A tools environment as a finished install leaves it: a Python, site-packages with torch's metadata, a marker
    (from this app's lock unless ``lock_sha256`` names another)."""
    env = tools_env()
    env.python.parent.mkdir(parents=True)
    env.python.symlink_to(sys.executable)
    site = env.site_packages(version)
    (site / "torch-2.13.0.dist-info").mkdir(parents=True)
    (site / "torch-2.13.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
    (site / "fake_tool_module.py").write_text("VALUE = 42\n")
    marker = {"python": version or app_python_version(), "requirements_sha256": lock_sha256 or requirements_digest()}
    (env.folder / MARKER).write_text(json.dumps(marker))
    return site


@pytest.fixture
def restored_path() -> Iterator[None]:
    before = list(sys.path)
    yield
    sys.path[:] = before
    sys.modules.pop("fake_tool_module", None)


def test_pip_lines_become_words() -> None:
    assert pip_step("Collecting torch==2.13.0") == "getting torch==2.13.0"
    line = "  Downloading transformers-5.24.0-py3-none-any.whl (12.3 MB)"
    assert pip_step(line) == "downloading transformers (12.3 MB)"
    assert pip_step("Building wheel for llama-cpp-python (pyproject.toml): started").startswith("building llama-cpp")
    assert pip_step("Installing collected packages: torch, peft") == "installing the packages (this takes a minute)"
    assert pip_step("Requirement already satisfied: numpy") is None


def test_nothing_installed_is_absent_and_jobs_run_with_this_python() -> None:
    status = tools_status()
    assert status.state is ToolsState.ABSENT and status.size_bytes == 0 and status.packages == {}
    assert local_python() == Path(sys.executable) and not activate()
    assert job_file(quantize_job) == Path(quantize_job.__file__)


def test_an_interrupted_install_is_partial_and_not_used() -> None:
    tools_env().python.parent.mkdir(parents=True)  # the venv was made; pip never finished
    assert tools_status().state is ToolsState.PARTIAL
    assert local_python() == Path(sys.executable)
    assert main(["tools", "status"]) == 0


def test_a_finished_install_is_imported_and_runs_the_jobs(restored_path: None) -> None:
    site = fake_installed()
    status = tools_status()
    assert status.state is ToolsState.INSTALLED and status.packages == {"torch": "2.13.0"} and status.size_bytes > 0
    assert activate() and str(site) in sys.path
    import fake_tool_module  # type: ignore[import-not-found]

    assert fake_tool_module.VALUE == 42
    assert local_python() == tools_env().python
    app_folder = (site / APP_PATH_FILE).read_text().strip()
    assert (Path(app_folder) / "trainer_payload" / "merge.py").is_file(), "jobs import the app"


def test_an_install_from_an_earlier_lock_works_and_asks_for_the_update(
    restored_path: None, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_installed(lock_sha256="0" * 64)  # an earlier Rentune's lock, before the trial's trainer was in it
    assert tools_status().state is ToolsState.OUTDATED
    assert activate() and local_python() == tools_env().python, "merge, export and chat go on working"
    assert main(["tools", "status"]) == 0
    assert "rentune tools install adds what this one uses" in capsys.readouterr().out


def test_an_install_for_another_python_is_not_imported(restored_path: None) -> None:
    fake_installed(version="3.9")
    assert tools_status().state is ToolsState.OTHER_PYTHON
    assert not activate() and local_python() == Path(sys.executable)


def test_remove_frees_the_space_and_says_how_much(capsys: pytest.CaptureFixture[str]) -> None:
    fake_installed()
    size = tools_status().size_bytes
    assert main(["tools", "remove"]) == 0
    assert capsys.readouterr().out.startswith("Removed the local tools: ") and not tools_env().folder.exists()
    assert size > 0 and remove_tools() == 0


async def test_a_python_of_another_version_is_refused_with_the_version_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "python-other"
    other.write_text("#!/bin/sh\necho 3.9\n")
    other.chmod(0o755)
    monkeypatch.setenv(PYTHON_ENV, str(other))
    with pytest.raises(LocalToolError, match=f"needs Python {app_python_version()}"):
        await find_base_python()
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    assert await find_base_python() == Path(sys.executable)


async def test_the_tools_children_get_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = tmp_path / "seen-env"
    spy = tmp_path / "python-spy"
    spy.write_text(f'#!/bin/sh\nenv > "{seen}"\necho {app_python_version()}\n')
    spy.chmod(0o755)
    monkeypatch.setenv(PYTHON_ENV, str(spy))
    monkeypatch.setenv("HF_TOKEN", "hf-for-no-child-0123456789")
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-for-no-child-0123456789")
    assert await find_base_python() == spy
    assert "for-no-child" not in seen.read_text() and PYTHON_ENV in seen.read_text()
    listed = await run_python(["-c", "import os; print(sorted(os.environ))"], what="listing the environment")
    assert "HF_TOKEN" not in listed and "RUNPOD_API_KEY" not in listed and PYTHON_ENV in listed


def test_the_cli_install_with_no_usable_python_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "no-such-python"))
    assert main(["tools", "install"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("rentune: error: installing the local tools needs Python") and "\n" not in error
    assert os.environ[PYTHON_ENV] in error or PYTHON_ENV in error


def test_a_removal_cut_short_leaves_an_unfinished_install_not_a_broken_one(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_installed()

    def fail(path: Path) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("desktop.services.local.toolenv.shutil.rmtree", fail)
    with pytest.raises(LocalToolError, match=r"could not delete .* quit Rentune"):
        remove_tools()
    assert tools_status().state is ToolsState.PARTIAL and local_python() == Path(sys.executable)


def _lock_line(lock: str, name: str) -> str:
    """``name``'s entry (version and every hash) of one of the project's lock files, as one line."""
    text = (Path(__file__).resolve().parents[2] / "installers" / "locks" / lock).read_text(encoding="utf-8")
    block = ("\n" + text).split(f"\n{name}==", 1)[1].split("\n    # via", 1)[0]
    return f"{name}==" + block.replace("\\\n", " ")


async def test_a_file_that_differs_from_the_lock_stops_the_install_in_one_line_and_installs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from desktop.services.local import toolenv

    version = _lock_line("base.txt", "annotated-types").split()[0].split("==")[1]
    monkeypatch.setattr(toolenv, "build_tools_text", lambda: _lock_line("build-tools.txt", "editables") + "\n")
    monkeypatch.setattr(toolenv, "requirements_text", lambda: f"annotated-types=={version} --hash=sha256:{'0' * 64}\n")
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    with pytest.raises(LocalToolError) as refused:
        await toolenv.install_tools(lambda _text, _fraction: None, links=[])
    message = str(refused.value)
    assert message.startswith("installing the local tools stopped: annotated-types==") and "\n" not in message
    assert "does not match the sha256 in Rentune's lock" in message
    site = tools_env().site_packages()
    assert (site / "editables").is_dir(), "the build tools went in, checked"
    assert (tools_env().folder / LEAN_CMAKE).is_file(), "the file CMAKE_ARGS names is in place before pip builds"
    assert not list(site.glob("annotated_types*")), "nothing of the refused package was installed"
    assert tools_status().state is ToolsState.PARTIAL


def test_pip_refusing_a_platform_the_lock_lacks_is_named() -> None:
    from desktop.services.local.toolenv import lock_refusal

    said = lock_refusal(["ERROR: No matching distribution found for torch==2.13.0+cpu"])
    assert said is not None and "holds no file of torch==2.13.0+cpu for this computer" in said
    assert lock_refusal(["ERROR: Could not build wheels for llama-cpp-python"]) is None


#: llama-cpp-python's CMake structure in miniature: its top project forces LLAMA_BUILD_COMMON on, then adds llama.cpp,
#: whose project reads the option and adds its `common` library (and that library's install rule) when it is on.
_TOP = """cmake_minimum_required(VERSION 3.21)
project(llama_cpp NONE)
set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)
add_subdirectory(vendor/llama.cpp)
"""
_LLAMA = """cmake_minimum_required(VERSION 3.14)
project("llama.cpp" NONE)
option(LLAMA_BUILD_COMMON "llama: build common utils library" OFF)
message(STATUS "common library: ${LLAMA_BUILD_COMMON}")
"""


def _configure(tmp_path: Path, cmake_args: str) -> str:
    import cmake

    (tmp_path / "src" / "vendor" / "llama.cpp").mkdir(parents=True)
    (tmp_path / "src" / "CMakeLists.txt").write_text(_TOP)
    (tmp_path / "src" / "vendor" / "llama.cpp" / "CMakeLists.txt").write_text(_LLAMA)
    arguments = shlex.split(cmake_args)  # as scikit-build-core reads CMAKE_ARGS
    program = Path(cmake.CMAKE_BIN_DIR) / "cmake"
    command = [str(program), "-S", str(tmp_path / "src"), "-B", str(tmp_path / "build"), *arguments]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.parametrize("folder", ["data", "Application Support"])
def test_the_local_build_of_llama_cpp_leaves_out_the_common_library_it_never_loads(tmp_path: Path, folder: str) -> None:
    lean = tmp_path / folder / LEAN_CMAKE
    lean.parent.mkdir()
    lean.write_bytes((Path(__file__).parents[2] / "resources" / "local-tools" / LEAN_CMAKE).read_bytes())
    assert "common library: ON" in _configure(tmp_path / "forced", ""), "llama-cpp-python forces it on"
    assert "common library: OFF" in _configure(tmp_path / "lean", llama_cmake_args(lean))


def test_the_users_own_cmake_args_come_last_and_win() -> None:
    said = shlex.split(llama_cmake_args(Path("/x y/lean.cmake"), " -DGGML_CUDA=on -DLLAVA_BUILD=on "))
    include = "-DCMAKE_PROJECT_llama.cpp_INCLUDE=/x y/lean.cmake"
    assert said == ["-DLLAVA_BUILD=off", include, "-DGGML_CUDA=on", "-DLLAVA_BUILD=on"]
