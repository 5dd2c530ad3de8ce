"""Whether an adapter fits a base model, checked the same way before an export and before a comparison.

Shapes come from the safetensors headers (:mod:`desktop.services.local.facts`, judged by
:mod:`desktop.core.export.compatibility`). Shapes alone can miss a wrong base: a LoRA for one architecture loads onto
another of the same sizes without error and answers nonsense, so when the base the adapter records is a folder on
this computer, its config is compared too.
"""

from __future__ import annotations

from pathlib import Path

from desktop.core.export.compatibility import Compatibility, Toolchain, check_compatibility
from desktop.services.local.common import LocalInputError
from desktop.services.local.facts import adapter_facts, base_facts, read_json

#: Config fields that must agree between the base an adapter records and the base it is used with.
_SHAPE_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_RETRY = "pass the --base it was trained on"


def recorded_base_mismatch(adapter: Path, base: Path) -> str | None:
    """How the adapter's recorded base differs from ``base``, when the recorded one is a folder here; else None."""
    recorded = read_json(adapter / "adapter_config.json", "the adapter folder").get("base_model_name_or_path")
    if not isinstance(recorded, str) or not (Path(recorded) / "config.json").is_file():
        return None
    if Path(recorded).resolve() == base.resolve():
        return None
    theirs = read_json(Path(recorded) / "config.json", "the adapter's recorded base")
    ours = read_json(base / "config.json", "the base model")
    differs = [
        f"{key} {theirs.get(key)} vs {ours.get(key)}" for key in _SHAPE_FIELDS if theirs.get(key) != ours.get(key)
    ]
    if not differs:
        return None
    return f"this adapter was trained on another base model: {recorded}, not {base} ({', '.join(differs)})"


def ensure_fits(adapter: Path, base: Path, tools: Toolchain | None = None) -> Compatibility:
    """The compatibility of ``adapter`` with ``base``, raising when it does not fit at all.

    Args:
        adapter: The PEFT adapter folder.
        base: The base model folder.
        tools: What llama.cpp and MLX support here (only the per-output verdicts need it).

    Raises:
        LocalInputError: Damaged files, or an adapter trained on another base; the message says which and why.
    """
    compatibility = check_compatibility(
        adapter_facts(adapter), base_facts(base), tools or Toolchain(None, "not asked for", None, "not asked for")
    )
    if not compatibility.fits:
        raise LocalInputError(f"{compatibility.problems[0]}; {_RETRY}")
    mismatch = recorded_base_mismatch(adapter, base)
    if mismatch:
        raise LocalInputError(f"{mismatch}; {_RETRY}")
    return compatibility
