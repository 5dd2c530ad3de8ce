"""The quantise tool a machine builds for K-quant GGUFs: a few lines of C over llama.cpp's own library.

llama.cpp's ``llama-quantize`` links its ``common`` library (argument parsing, chat parsers, an HTTP client): 53
compile units, about half the build, none of which quantising needs. This tool calls the same library function
(``llama_model_quantize`` with llama.cpp's default parameters, as ``llama-quantize`` does without options) from a
small CMake project that adds llama.cpp's source as a subproject, where llama.cpp leaves ``common``, its tools,
tests and examples out by default.

Quantising runs ggml's reference quantise functions (``ggml_quantize_chunk`` in ``ggml-base``); llama.cpp's own
sources only read the model and hand its tensors over. So the build leaves out ggml's CPU backend (nothing computes)
and compiles llama.cpp's own sources without optimisation (``-O0``) while ``ggml-base``, where every weight is
converted and quantised, keeps the release ``-O3``. The Q4_K_M file of SmolLM2-135M is byte for byte the one
llama-cpp-python's full build writes. Measured (llama.cpp of llama-cpp-python 0.3.36, CPU seconds for the library and
this tool): 293 for the full release build, 201 without the CPU backend, 132 with llama.cpp's sources at ``-O1`` too;
quantising SmolLM2-135M took 3.2 and 2.3 CPU seconds. ``-O0`` then took 14 % less than ``-O1`` (121 against 141 CPU
seconds, built one after the other on the same busy machine): the build runs while the rented machine bills.
"""

from __future__ import annotations

from pathlib import Path

from trainer_payload.protocol import QUANTIZE_GGUF_TYPES

#: The executable's name in the build folder.
TOOL_NAME = "rentune-quantize"
#: llama.cpp's CMake options for the library alone: no compute backend (quantising needs none), static, no downloads.
BUILD_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_CPU=OFF",
    "-DGGML_CUDA=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
)

_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(rentune_quantize C CXX)
# As a subproject, llama.cpp builds its library only: no common library, tools, tests or examples.
add_subdirectory("{sources}" llama.cpp)
# llama.cpp's own sources only read the model: unoptimised, they build fastest; ggml-base's quantise loops keep -O3.
target_compile_options(llama PRIVATE -O0)
add_executable({tool} quantize.c)
target_link_libraries({tool} PRIVATE llama)
"""

_SOURCE = """/* rentune-quantize SOURCE.gguf TARGET.gguf TYPE: llama_model_quantize, default parameters. */
#include <stdio.h>
#include <string.h>
#include "llama.h"

static const struct {{ const char *name; enum llama_ftype ftype; }} TYPES[] = {{
{types}
}};

int main(int argc, char **argv) {{
    if (argc != 4) {{
        fprintf(stderr, "usage: {tool} SOURCE.gguf TARGET.gguf TYPE\\n");
        return 2;
    }}
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {{
        if (strcmp(argv[3], TYPES[i].name) != 0) continue;
        llama_backend_init();
        struct llama_model_quantize_params params = llama_model_quantize_default_params();
        params.ftype = TYPES[i].ftype;
        uint32_t code = llama_model_quantize(argv[1], argv[2], &params);
        llama_backend_free();
        if (code != 0) {{
            fprintf(stderr, "llama_model_quantize returned %u\\n", (unsigned) code);
            return 1;
        }}
        return 0;
    }}
    fprintf(stderr, "unknown GGUF type %s\\n", argv[3]);
    return 2;
}}
"""


def write_project(sources: Path, project: Path) -> None:
    """Writes the tool's CMake project into ``project``, over llama.cpp's source folder ``sources``."""
    project.mkdir(parents=True, exist_ok=True)
    types = "\n".join(f'    {{"{name}", LLAMA_FTYPE_MOSTLY_{name}}},' for name in QUANTIZE_GGUF_TYPES)
    (project / "CMakeLists.txt").write_text(_CMAKE.format(sources=sources.as_posix(), tool=TOOL_NAME))
    (project / "quantize.c").write_text(_SOURCE.format(types=types, tool=TOOL_NAME))


def build_steps(project: Path, build: Path, jobs: int) -> list[list[str]]:
    """The two CMake commands that configure and build the tool from ``project`` into ``build``."""
    return [
        ["cmake", "-S", str(project), "-B", str(build), *BUILD_OPTIONS],
        ["cmake", "--build", str(build), "--target", TOOL_NAME, "-j", str(jobs)],
    ]
