# Run by CMake right after llama.cpp's project() call when llama-cpp-python is built from source (CMAKE_ARGS holds
# -DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file>; see the Makefile and desktop/services/local/toolenv.py).
#
# llama-cpp-python's CMakeLists.txt forces LLAMA_BUILD_COMMON ON, so every build compiles llama.cpp's `common` library
# (argument parsing, chat parsers, the HTTP client cpp-httplib, downloads) and ships it as lib/libllama-common.so. The
# Python package loads only libllama and libggml* (and libmtmd, which LLAVA_BUILD=off already leaves out): nothing
# loads libllama-common. Turning it back off here, before llama.cpp reads the option, leaves out its 53 compile units
# and its install rule, so the build and `cmake --install` cover exactly what the package uses.
# Measured on 2 cores (llama-cpp-python 0.3.36, GGML_NATIVE=off, LLAVA_BUILD=off): 663 -> 319 CPU seconds.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
