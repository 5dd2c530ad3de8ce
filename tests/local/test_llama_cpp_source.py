"""llama.cpp's converters taken from the installed llama-cpp-python's sdist, cached once, and what they convert."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    monkeypatch.setenv("RENTUNE_PYPI_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    with pytest.raises(LocalToolError) as error:
        await llama_cpp_converters(no_progress)
    message = str(error.value)
    assert "package index" in message
    assert "try again" in message
    assert [p.name for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []


@pytest.fixture
def index_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, bytes]]:
    """A package index on loopback listing the pinned archive, with whatever bytes the test puts in it."""
    served: dict[str, bytes] = {}
    pin = llama_cpp_source.source_pin(importlib.metadata.version("llama-cpp-python"))

    class Index(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/llama-cpp-python/"):
                name = served.get("filename", pin.filename.encode()).decode()
                listing = {"files": [{"filename": name, "url": f"../../files/{name}", "hashes": {}}]}
                body, kind = json.dumps(listing).encode(), "application/vnd.pypi.simple.v1+json"
            else:
                body, kind = served["archive"], "application/octet-stream"
                served["fetched"] = served.get("fetched", b"") + b"."
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("RENTUNE_TOOLS_CACHE", str(tmp_path / "tools"))
    monkeypatch.setenv("RENTUNE_PYPI_URL", f"http://127.0.0.1:{server.server_port}/simple")
    yield served
    server.shutdown()
    server.server_close()


async def test_a_source_archive_whose_sha256_differs_is_deleted_unopened(
    index_serving: dict[str, bytes], tmp_path: Path
) -> None:
    index_serving["archive"] = b"not the archive PyPI published"
    with pytest.raises(LocalToolError) as error:
        await llama_cpp_converters(no_progress)
    message = str(error.value)
    assert f"has sha256 {hashlib.sha256(index_serving['archive']).hexdigest()}, not the pinned" in message
    assert "llama_cpp_python-" in message and "deleted unopened" in message
    leftovers = [p for p in (tmp_path / "tools").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert leftovers == [], "nothing of the archive was kept or unpacked"


async def test_a_version_without_a_pinned_source_says_to_reinstall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_cpp_source.importlib.metadata, "version", lambda _name: "0.0.1")
    with pytest.raises(LocalToolError, match=r"llama-cpp-python 0\.0\.1 is installed, but Rentune knows the source"):
        await llama_cpp_converters(no_progress)


async def test_the_converters_and_the_library_sources_share_one_download(
    index_serving: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import tarfile

    members = ("convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py", "src/CMakeLists.txt", "include/llama.h")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in members:
            info = tarfile.TarInfo(f"llama_cpp_python-0.0.2/vendor/llama.cpp/{name}")
            info.size = 1
            archive.addfile(info, io.BytesIO(b"#"))
    index_serving["archive"], index_serving["filename"] = buffer.getvalue(), b"llama_cpp_python-0.0.2.tar.gz"
    pin = llama_cpp_source.SourcePin(
        "0.0.2", "llama_cpp_python-0.0.2.tar.gz", hashlib.sha256(buffer.getvalue()).hexdigest()
    )
    monkeypatch.setattr(llama_cpp_source, "source_pin", lambda _version: pin)
    monkeypatch.setattr(llama_cpp_source, "installed_version", lambda: "0.0.2")
    converters = await llama_cpp_converters(no_progress)
    sources = await llama_cpp_source.llama_cpp_build_sources(no_progress)
    assert converters.convert_hf.is_file() and (sources / "include" / "llama.h").is_file()
    assert index_serving["fetched"] == b".", "the archive is downloaded once"
    (tmp_path / "tools" / "archives" / pin.filename).write_bytes(b"damaged")
    assert (
        await llama_cpp_source.llama_cpp_source_archive("0.0.2", no_progress)
        == sources.parent / "archives" / pin.filename
    )
    assert index_serving["fetched"] == b"..", "a damaged copy is fetched anew"
