"""llama.cpp's converters taken from the installed llama-cpp-python's sdist, cached once, and what they convert."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from desktop.services.local import llama_cpp_source
from desktop.services.local.common import LocalToolError, no_progress
from desktop.services.local.llama_cpp_source import convertible_architectures, llama_cpp_converters, tools_cache


async def test_converters_match_the_installed_llama_cpp_python() -> None:
    converters = await llama_cpp_converters(no_progress)
    assert converters.version == importlib.metadata.version("llama-cpp-python")
    assert converters.root == tools_cache() / f"llama.cpp-{converters.version}"
    assert converters.convert_hf.is_file()
    assert converters.convert_lora.is_file()
    assert (converters.gguf_py / "gguf" / "gguf_reader.py").is_file()
    assert (await llama_cpp_converters(no_progress)) == converters  # the second call reads the cache


async def test_convertible_architectures_come_from_the_converter() -> None:
    architectures = convertible_architectures(await llama_cpp_converters(no_progress))
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Gemma2ForCausalLM"} <= architectures
    assert "FooForCausalLM" not in architectures
    assert len(architectures) > 100


async def test_missing_llama_cpp_python_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(llama_cpp_source.importlib.metadata, "version", not_installed)
    with pytest.raises(LocalToolError, match="rentune tools install"):
        await llama_cpp_converters(no_progress)


async def test_unreachable_package_index_says_to_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "tools"
    monkeypatch.setenv("RENTUNE_TOOLS_CACHE", str(cache))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(LocalToolError) as error:
        await llama_cpp_converters(no_progress)
    message = str(error.value)
    assert "package index" in message
    assert "try again" in message
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
