"""Reads what the compatibility check judges: adapter and base configs and the shapes in their safetensors files.

Only the safetensors headers are read (a few kilobytes), so the check takes milliseconds even for a 70B base. A
file shorter than its header says is reported as damaged here, before any step loads it.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import struct
import sys
from pathlib import Path
from typing import Any

from desktop.core.export.compatibility import AdapterFacts, BaseFacts
from desktop.services.local.common import LocalInputError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
_INDEX = "model.safetensors.index.json"
_MAX_HEADER = 100 << 20


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``.

    Raises:
        LocalInputError: Missing, unreadable or not an object; the message names ``what`` and the file.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LocalInputError(f"{what} has no {path.name} ({path}); point at the right folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LocalInputError(f"{path} is not readable JSON ({exc}); {what} is damaged, fetch it again") from exc
    if not isinstance(data, dict):
        raise LocalInputError(f"{path} must hold a JSON object; {what} is damaged, fetch it again")
    return data


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from a safetensors file's header, after checking the file holds all the data.

    Raises:
        LocalInputError: Not a safetensors file, or cut short (a download or copy that did not finish).
    """
    damaged = f"{path} is damaged (not a complete safetensors file); copy or download it again"
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > _MAX_HEADER:
                raise LocalInputError(damaged)
            header = json.loads(handle.read(length))
        size = path.stat().st_size
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LocalInputError(damaged) from exc
    if not isinstance(header, dict):
        raise LocalInputError(damaged)
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    ends = [info.get("data_offsets", [0, 0])[1] for info in tensors.values() if isinstance(info, dict)]
    if not tensors or size < 8 + length + max(ends, default=0):
        raise LocalInputError(damaged)
    return {name: tuple(info["shape"]) for name, info in tensors.items()}


def adapter_facts(adapter: Path) -> AdapterFacts:
    """What the adapter folder says: its config and its tensors' shapes."""
    config = read_json(adapter / "adapter_config.json", "the adapter folder")
    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise LocalInputError(f"{adapter} has no {ADAPTER_WEIGHTS}; bring the adapter home again (rentune pull RUN)")
    return AdapterFacts(
        peft_type=str(config.get("peft_type", "LORA")),
        rank=int(config.get("r", 0)),
        alpha=float(config.get("lora_alpha", 0)),
        target_modules=_names(config.get("target_modules")),
        modules_to_save=_names(config.get("modules_to_save")),
        tensors=safetensors_shapes(weights),
        use_dora=bool(config.get("use_dora", False)),
    )


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(str(item) for item in value) if isinstance(value, list) else ()


def base_weight_files(base: Path) -> list[Path]:
    """The base model's safetensors files (one, or the shards its index names).

    Raises:
        LocalInputError: The folder has no safetensors weights.
    """
    index = base / _INDEX
    if index.is_file():
        weight_map = read_json(index, "the base model").get("weight_map", {})
        return [base / name for name in sorted(set(weight_map.values()))]
    files = sorted(base.glob("*.safetensors"))
    if not files:
        raise LocalInputError(
            f"{base} has no .safetensors weights; Rentune reads safetensors models (download the model's "
            "safetensors files, or pass --base with a Hub id)"
        )
    return files


def base_facts(base: Path) -> BaseFacts:
    """What the base model folder says: its architecture and its weights' shapes."""
    config = read_json(base / "config.json", "the base model")
    tensors: dict[str, tuple[int, ...]] = {}
    for file in base_weight_files(base):
        tensors.update(safetensors_shapes(file))
    architectures = config.get("architectures") or []
    return BaseFacts(tuple(str(name) for name in architectures), str(config.get("model_type", "")), tensors)


def mlx_model_types() -> tuple[frozenset[str] | None, str]:
    """The model types mlx-lm can load here, or None and why MLX cannot be used on this computer."""
    if sys.platform == "darwin" and platform.machine() != "arm64":
        return None, "MLX needs Apple Silicon; this Mac has an Intel processor"
    if sys.platform not in ("darwin", "linux"):
        return None, "MLX runs on Apple Silicon Macs and Linux only"
    spec = importlib.util.find_spec("mlx_lm")  # finds the package without importing it (and MLX)
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("mlx") is None:
        return None, "MLX is not installed: install the local tools on an Apple Silicon Mac (rentune tools install)"
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    return frozenset(p.stem for p in models.glob("*.py") if not p.stem.startswith("_")), ""
