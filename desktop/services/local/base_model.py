"""The base model on this computer: a local folder, or a download from the Hugging Face Hub (cached, resumable).

A download's token (for gated models) comes from the secret store or ``HF_TOKEN``, never from the command line;
``HF_ENDPOINT`` points it at a mirror.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import importlib
import json
import os
import re
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from desktop.services.local.common import LocalInputError, LocalToolError, Progress, no_progress
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretName, SecretStore, SecretStoreError

#: A Hugging Face repository id: an owner and a name of letters, digits, ``-``, ``_`` and ``.``.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
#: Suffixes of files a user may have meant instead of a Hub id (the file is just missing).
_FILE_SUFFIXES = frozenset({".gguf", ".safetensors", ".bin", ".json", ".jsonl", ".pt", ".pth", ".txt"})
#: What a base needs locally: configs, tokenizer, chat template and safetensors weights (not .bin, .gguf, onnx).
_WANTED = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken"]
#: A model's small files: config, tokenizer, chat template (what is checked before the weights are downloaded).
_DESCRIPTION = ["*.json", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken"]


def hub_cache() -> Path:
    """Where downloaded base models are kept (the app's cache folder)."""
    return app_paths().cache_dir / "hub"


class BaseState(StrEnum):
    """Where a base model stands on this computer."""

    HERE = "here"  # a model folder, or a finished download in the cache
    DOWNLOAD = "download"  # a Hub id that is not in the cache yet
    UNNAMED = "unnamed"  # nothing says which base it is
    NOT_A_MODEL = "not_a_model"  # a folder without config.json
    NOT_FOUND = "not_found"  # neither a folder nor a Hub id


@dataclass(frozen=True)
class BaseAvailability:
    """Whether the base model ``name`` is on this computer, found without the network.

    Attributes:
        name: The name as given (a folder or a Hub id), or None.
        state: Here, to download, or why it cannot be used.
        folder: Its folder when it is here.
    """

    name: str | None
    state: BaseState
    folder: Path | None = None

    @property
    def hub_id(self) -> str | None:
        """The Hub id to download, when the base must be downloaded."""
        return self.name if self.state is BaseState.DOWNLOAD else None


def base_availability(name: str | None) -> BaseAvailability:
    """Where the base model ``name`` stands: a folder, a cached download, a download to make, or unusable."""
    if not name:
        return BaseAvailability(name, BaseState.UNNAMED)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return BaseAvailability(name, BaseState.NOT_A_MODEL)
        return BaseAvailability(name, BaseState.HERE, path.resolve())
    if not _is_hub_id(name, path):
        return BaseAvailability(name, BaseState.NOT_FOUND)
    cached = cached_snapshot(name)
    if cached is not None:
        return BaseAvailability(name, BaseState.HERE, cached)
    return BaseAvailability(name, BaseState.DOWNLOAD)


def _is_hub_id(name: str, path: Path) -> bool:
    """Whether ``name`` reads as ``org/name`` (dots allowed: ``Qwen/Qwen2.5-7B``), not a missing file's path."""
    return bool(_HUB_ID.fullmatch(name)) and path.suffix.lower() not in _FILE_SUFFIXES


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached download of ``repo_id`` when it has a config and weights (read from the cache folder only)."""
    snapshots = hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    for snapshot in sorted(snapshots.iterdir()):
        if (snapshot / "config.json").is_file() and _weights_complete(snapshot):
            return snapshot
    return None


def _weights_complete(folder: Path) -> bool:
    """Whether the safetensors weights are all there (every shard the index names, or one file)."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return any(folder.glob("*.safetensors"))
    try:
        shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
    except (OSError, ValueError, AttributeError):
        return False
    return bool(shards) and all((folder / shard).is_file() for shard in shards)


async def hub_download_bytes(repo_id: str, secrets: SecretStore | None = None) -> int | None:
    """How many bytes downloading ``repo_id`` fetches (the files Rentune keeps), or None when the Hub does not say.

    Asks the Hub for the repository's file list (one request, no download); any failure gives None.
    """
    return await asyncio.to_thread(_tree_bytes, repo_id, _token(secrets))


def _tree_bytes(repo_id: str, token: str | None) -> int | None:
    from huggingface_hub import HfApi  # heavy import, only when the Hub is really asked

    try:
        entries = HfApi(endpoint=os.environ.get("HF_ENDPOINT"), token=token).list_repo_tree(repo_id, recursive=True)
        sizes = [
            int(getattr(entry, "size", 0) or 0)
            for entry in entries
            if any(fnmatch.fnmatch(entry.path.rsplit("/", 1)[-1], pattern) for pattern in _WANTED)
        ]
    except Exception:  # noqa: BLE001 - offline, gated, unknown: the size is simply not known
        return None
    return sum(sizes) if sizes else None


class _DownloadStoppedError(Exception):
    """The download was cancelled (raised in huggingface_hub's progress updates, which ends the download)."""


async def local_base(name: str | None, progress: Progress = no_progress, secrets: SecretStore | None = None) -> Path:
    """The folder of the base model ``name``: a folder as it is, a Hub id downloaded (or found in the cache).

    ``progress`` is called on the event loop. Cancelling the awaiting task stops a download at its next chunk;
    finished files stay in the cache, so the next try resumes.

    Raises:
        LocalToolError: No name, a folder without ``config.json``, or a Hub model that cannot be downloaded.
    """
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def report(text: str, fraction: float | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(progress, text, fraction)

    try:
        return await asyncio.to_thread(_resolve, name, report, secrets, stop)
    except asyncio.CancelledError:
        stop.set()
        raise


async def base_description(
    name: str | None, progress: Progress = no_progress, secrets: SecretStore | None = None
) -> Path:
    """A folder with the base model's config and tokenizer files: what to check before its weights come.

    A folder is used as it is; a Hub model's small files alone are downloaded (kilobytes, into the same cache the
    weights go to later), unless the whole model is cached already.

    Raises:
        LocalToolError: As :func:`local_base`.
    """
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def report(text: str, fraction: float | None) -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(progress, text, fraction)

    try:
        return await asyncio.to_thread(_resolve, name, report, secrets, stop, _DESCRIPTION)
    except asyncio.CancelledError:
        stop.set()
        raise


def _resolve(
    name: str | None,
    progress: Progress,
    secrets: SecretStore | None,
    stop: threading.Event,
    patterns: list[str] | None = None,
) -> Path:
    if not name:
        raise LocalInputError("the adapter does not say which base model it was trained on; pass --base MODEL")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LocalInputError(f"{path} has no config.json, so it is not a model folder; pass the base's folder")
        return path.resolve()
    if not _is_hub_id(name, path):
        raise LocalInputError(f"{name}: no such folder, and not a Hugging Face id (org/name); pass --base MODEL")
    if patterns is not None and (cached := cached_snapshot(name)) is not None:
        return cached
    return _download(name, progress, _token(secrets), stop, patterns or _WANTED)


def _token(secrets: SecretStore | None) -> str | None:
    try:
        return (secrets or SecretStore()).get(SecretName.HUGGINGFACE)
    except SecretStoreError:
        return None


def _download(
    repo_id: str, progress: Progress, token: str | None, stop: threading.Event, patterns: list[str] | None = None
) -> Path:
    from huggingface_hub import snapshot_download  # heavy import, only when the Hub is really needed
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    unreachable: tuple[type[Exception], ...] = (LocalEntryNotFoundError, HfHubHTTPError, OSError, *_network_errors())
    try:
        folder = snapshot_download(
            repo_id,
            cache_dir=str(hub_cache()),
            allow_patterns=patterns or _WANTED,
            token=token,
            tqdm_class=_progress_bar(progress, stop),
            endpoint=os.environ.get("HF_ENDPOINT"),  # read now: huggingface_hub reads it once, at import
        )
    except GatedRepoError as exc:
        raise LocalToolError(
            f"{repo_id} is gated: accept its licence on huggingface.co, then store your token in Settings or set "
            "HF_TOKEN"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise LocalInputError(f"{repo_id} is not on the Hugging Face Hub (or is private: store a token)") from exc
    except unreachable as exc:
        raise LocalToolError(
            f"could not download {repo_id} ({type(exc).__name__}: {str(exc)[:200]}); check the connection and run "
            "the command again: finished files are kept"
        ) from exc
    return Path(str(folder))


def _network_errors() -> tuple[type[Exception], ...]:
    """What the Hub client's HTTP library raises when a connection drops mid-download (not an OSError)."""
    errors: list[type[Exception]] = []
    for module in ("httpx2", "httpx"):  # huggingface_hub 1.x talks through httpx2; older ones through httpx
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(module).HTTPError)
    return tuple(errors)


def _progress_bar(progress: Progress, stop: threading.Event) -> Any:
    """A tqdm class that reports to ``progress`` instead of drawing on a terminal, and ends the download on ``stop``."""
    from tqdm.auto import tqdm

    class ProgressBar(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False
            kwargs["file"] = _Discard()
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if stop.is_set():
                raise _DownloadStoppedError
            return super().update(n)  # type: ignore[no-any-return]

        def display(self, *args: Any, **kwargs: Any) -> None:
            fraction = self.n / self.total if self.total else None
            progress(f"downloading the base model: {self.desc or ''}".rstrip(": "), fraction)

    return ProgressBar


class _Discard:
    """A text sink for tqdm's own drawing."""

    def write(self, _text: str) -> None:
        """Drops the text."""

    def flush(self) -> None:
        """Nothing to flush."""
