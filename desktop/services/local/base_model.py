"""The base model on this computer: a local folder, or a download from the Hugging Face Hub (cached, resumable).

A download's token (for gated models) comes from the secret store or ``HF_TOKEN``, never from the command line;
``HF_ENDPOINT`` points it at a mirror.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from desktop.services.local.common import LocalInputError, LocalToolError, Progress, no_progress
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretName, SecretStore, SecretStoreError

#: What a base needs locally: configs, tokenizer, chat template and safetensors weights (not .bin, .gguf, onnx).
_WANTED = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken"]


def hub_cache() -> Path:
    """Where downloaded base models are kept (the app's cache folder)."""
    return app_paths().cache_dir / "hub"


async def local_base(name: str | None, progress: Progress = no_progress, secrets: SecretStore | None = None) -> Path:
    """The folder of the base model ``name``: a folder as it is, a Hub id downloaded (or found in the cache).

    Raises:
        LocalToolError: No name, a folder without ``config.json``, or a Hub model that cannot be downloaded.
    """
    return await asyncio.to_thread(_resolve, name, progress, secrets)


def _resolve(name: str | None, progress: Progress, secrets: SecretStore | None) -> Path:
    if not name:
        raise LocalInputError("the adapter does not say which base model it was trained on; pass --base MODEL")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LocalInputError(f"{path} has no config.json, so it is not a model folder; pass the base's folder")
        return path.resolve()
    if name.count("/") != 1 or not all(name.split("/")) or path.suffix:
        raise LocalInputError(f"{name}: no such folder, and not a Hugging Face id (org/name); pass --base MODEL")
    return _download(name, progress, _token(secrets))


def _token(secrets: SecretStore | None) -> str | None:
    try:
        return (secrets or SecretStore()).get(SecretName.HUGGINGFACE)
    except SecretStoreError:
        return None


def _download(repo_id: str, progress: Progress, token: str | None) -> Path:
    from huggingface_hub import snapshot_download  # heavy import, only when the Hub is really needed
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = snapshot_download(
            repo_id,
            cache_dir=str(hub_cache()),
            allow_patterns=_WANTED,
            token=token,
            tqdm_class=_progress_bar(progress),
            endpoint=os.environ.get("HF_ENDPOINT"),  # read now: huggingface_hub reads it once, at import
        )
    except GatedRepoError as exc:
        raise LocalToolError(
            f"{repo_id} is gated: accept its licence on huggingface.co, then store your token in Settings or set "
            "HF_TOKEN"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise LocalInputError(f"{repo_id} is not on the Hugging Face Hub (or is private: store a token)") from exc
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise LocalToolError(
            f"could not download {repo_id} ({type(exc).__name__}: {str(exc)[:200]}); check the connection and run "
            "the command again: finished files are kept"
        ) from exc
    return Path(str(folder))


def _progress_bar(progress: Progress) -> Any:
    """A tqdm class that reports to ``progress`` instead of drawing on a terminal."""
    from tqdm.auto import tqdm

    class ProgressBar(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False
            kwargs["file"] = _Discard()
            super().__init__(*args, **kwargs)

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
