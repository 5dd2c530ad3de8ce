"""Finding the base model: a folder as it is, a Hub id downloaded from a fake Hub (token from the keyring, cached)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.services.local.base_model import local_base
from desktop.services.local.common import LocalInputError, LocalToolError
from desktop.services.platform.secrets import SecretName, SecretStore
from tests.fakes.hub import FakeHub, HubRepo
from tests.fixtures.tiny_models import TinyModel


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    import huggingface_hub.constants

    served = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs offline; this Hub is local
    yield served
    served.stop()


def test_a_folder_is_used_as_it_is(tiny_model: TinyModel) -> None:
    assert asyncio.run(local_base(str(tiny_model.path))) == tiny_model.path.resolve()


def test_a_hub_id_downloads_once_with_progress(hub: FakeHub, tiny_model: TinyModel) -> None:
    hub.repos["someone/tiny"] = HubRepo(tiny_model.path)
    seen: list[tuple[str, float | None]] = []
    folder = asyncio.run(local_base("someone/tiny", lambda text, fraction: seen.append((text, fraction))))
    assert (folder / "config.json").read_bytes() == (tiny_model.path / "config.json").read_bytes()
    assert (folder / "model.safetensors").stat().st_size == (tiny_model.path / "model.safetensors").stat().st_size
    assert seen and seen[-1][1] == 1.0
    downloads = [path for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path]
    asyncio.run(local_base("someone/tiny"))
    again = [path for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path]
    assert again == downloads  # the second call reads the cache: no file is fetched again


def test_a_gated_model_uses_the_keyrings_token_and_says_so_without_it(hub: FakeHub, tiny_model: TinyModel) -> None:
    hub.repos["org/gated"] = HubRepo(tiny_model.path, token="hf_secret_token")
    with pytest.raises(LocalToolError, match=r"org/gated is gated: accept its licence"):
        asyncio.run(local_base("org/gated"))
    SecretStore().set(SecretName.HUGGINGFACE, "hf_secret_token")
    folder = asyncio.run(local_base("org/gated"))
    assert (folder / "config.json").is_file()
    assert ("GET", "/api/models/org/gated/revision/main", "Bearer hf_secret_token") in hub.requests


def test_an_unknown_model_and_a_bad_name_are_named(hub: FakeHub) -> None:
    with pytest.raises(LocalInputError, match=r"nobody/nothing is not on the Hugging Face Hub"):
        asyncio.run(local_base("nobody/nothing"))
    with pytest.raises(LocalInputError, match=r"pass --base MODEL"):
        asyncio.run(local_base("not a model"))
    with pytest.raises(LocalInputError, match=r"does not say which base model"):
        asyncio.run(local_base(None))


def test_a_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LocalInputError, match=r"has no config\.json"):
        asyncio.run(local_base(str(tmp_path)))


def test_a_connection_dropped_mid_download_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub client's HTTP library raises its own errors, not OSError, when a connection drops (it reached the
    app's error reporter as a traceback)."""
    import httpx2
    import huggingface_hub

    def dropped(*_args: object, **_kwargs: object) -> None:
        raise httpx2.ReadError("[Errno 104] Connection reset by peer")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", dropped)
    with pytest.raises(LocalToolError, match=r"could not download someone/tiny \(ReadError.*check the connection"):
        asyncio.run(local_base("someone/tiny"))
