"""Resolving ``--model``: a local folder or ``config.json``, the bundled catalog, or the Hugging Face Hub.

The Hub is only asked when the name is neither a path nor in the catalog; its answers are cached in the app's cache
folder, and a token (for gated models) comes from the secret store, never from the command line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from desktop.core.sizing.architecture import Architecture, ArchitectureError, architecture_from_config
from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.gpus import GpuSpec, gpus_from_json
from desktop.services.platform.paths import app_paths
from desktop.services.platform.resources import resource_bytes
from desktop.services.platform.secrets import SecretName, SecretStore, SecretStoreError

ConfigFetcher = Callable[[str], dict[str, Any]]

_NOT_CAUSAL = {"bert", "roberta", "t5", "mt5", "bart", "distilbert", "deberta", "deberta-v2", "electra", "vit", "clip"}


class ModelResolutionError(LookupError):
    """``--model`` names nothing Rentune can size; the message says what to pass instead.

    Attributes:
        reason: What went wrong, for front ends that word it themselves: ``no-config``, ``bad-config``,
            ``invalid-id``, ``not-found``, ``unreachable`` or ``unknown``.
    """

    def __init__(self, message: str, reason: str = "unknown") -> None:
        super().__init__(message)
        self.reason = reason


@lru_cache(maxsize=1)
def load_catalog() -> ModelCatalog:
    """Returns the bundled model catalog (read once per process)."""
    return ModelCatalog.from_json(json.loads(resource_bytes("models.json")))


@lru_cache(maxsize=1)
def load_gpus() -> tuple[GpuSpec, ...]:
    """Returns the bundled GPU types (read once per process)."""
    return tuple(gpus_from_json(json.loads(resource_bytes("gpus.json"))))


def _read_config_file(path: Path) -> dict[str, Any]:
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise ModelResolutionError(
            f"{path} has no config.json; point --model at a model folder or its config.json", "no-config"
        )
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelResolutionError(
            f"{config_file} is not valid JSON ({exc}); re-download the model's config", "bad-config"
        ) from exc
    if not isinstance(data, dict):
        raise ModelResolutionError(f"{config_file} must hold a JSON object", "bad-config")
    return data


def hub_config_fetcher(secrets: SecretStore | None = None) -> ConfigFetcher:
    """Returns a fetcher that downloads ``config.json`` from the Hub into the app's cache."""

    def fetch(repo_id: str) -> dict[str, Any]:
        from huggingface_hub import hf_hub_download  # heavy import, only when the Hub is really needed
        from huggingface_hub.errors import (
            HfHubHTTPError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )

        try:
            token = (secrets or SecretStore()).get(SecretName.HUGGINGFACE)
        except SecretStoreError:
            token = None
        cache = app_paths().cache_dir / "hub"
        try:
            path = hf_hub_download(repo_id, "config.json", cache_dir=str(cache), token=token)
        except HFValidationError as exc:
            raise ModelResolutionError(
                f"{repo_id!r} is not a valid Hugging Face model id ({exc})", "invalid-id"
            ) from exc
        except RepositoryNotFoundError as exc:
            raise ModelResolutionError(
                f"{repo_id} is not on the Hugging Face Hub (or is gated: store a Hugging Face token in Settings "
                "or set HF_TOKEN)",
                "not-found",
            ) from exc
        except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
            raise ModelResolutionError(
                f"could not read {repo_id}/config.json from the Hugging Face Hub ({type(exc).__name__}); check "
                "the connection, or pass a local model folder or a catalog model (rentune plan --list-models)",
                "unreachable",
            ) from exc
        return _read_config_file(Path(path))

    return fetch


def _checked(config: dict[str, Any], name: str) -> Architecture:
    model_type = str(config.get("model_type", ""))
    if model_type in _NOT_CAUSAL or config.get("is_encoder_decoder"):
        raise ArchitectureError(
            f"{name} is a {model_type or 'encoder-decoder'} model; Rentune fine-tunes decoder-only chat LLMs"
        )
    return architecture_from_config(config, name)


def resolve_model(name: str, fetch: ConfigFetcher | None = None) -> Architecture:
    """Finds the architecture for ``--model``.

    Args:
        name: A local folder, a ``config.json`` path, a catalog id or alias, or a Hub id (``org/name``).
        fetch: Downloads a Hub config; the real Hub by default (tests inject their own).

    Raises:
        ModelResolutionError: Nothing matches; the message suggests close catalog names.
        ArchitectureError: The config lacks fields the estimator needs, or is not a causal LM.
    """
    path = Path(name).expanduser()
    if path.exists():
        return _checked(_read_config_file(path), str(path))
    found = load_catalog().find(name)
    if found is not None:
        return found
    if name.count("/") == 1 and all(name.split("/")):
        return _checked((fetch or hub_config_fetcher())(name), name)
    hints = load_catalog().suggestions(name)
    hint = f"; did you mean {', '.join(hints)}?" if hints else "; see rentune plan --list-models"
    raise ModelResolutionError(f"unknown model {name!r}: not a folder, not in the catalog, not a Hub id{hint}")
