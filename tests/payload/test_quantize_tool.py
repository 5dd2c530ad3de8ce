"""The machine's quantise tool project: every K-quant the app may ask for is in its table, over the given source."""

from __future__ import annotations

from pathlib import Path

from trainer_payload.protocol import QUANTIZE_GGUF_TYPES
from trainer_payload.quantize_tool import TOOL_NAME, build_steps, write_project


def test_the_project_names_every_k_quant_and_builds_the_tool_alone_over_the_source(tmp_path: Path) -> None:
    sources = tmp_path / "llama.cpp source"
    write_project(sources, tmp_path / "project")
    program = (tmp_path / "project" / "quantize.c").read_text()
    for name in QUANTIZE_GGUF_TYPES:
        assert f'{{"{name}", LLAMA_FTYPE_MOSTLY_{name}}}' in program
    cmake = (tmp_path / "project" / "CMakeLists.txt").read_text()
    assert f'add_subdirectory("{sources.as_posix()}" llama.cpp)' in cmake, "quoted: a path may hold spaces"
    assert "target_compile_options(llama PRIVATE -O0)" in cmake, "llama.cpp's own sources only read the model"
    configure, build = build_steps(tmp_path / "project", tmp_path / "build", 3)
    assert "-DLLAMA_BUILD_COMMON=ON" not in configure and build[-4:] == ["--target", TOOL_NAME, "-j", "3"]
    assert "-DGGML_CPU=OFF" in configure, "quantising computes nothing: no CPU backend to build"
