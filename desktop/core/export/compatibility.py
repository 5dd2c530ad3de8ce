"""Whether a LoRA adapter fits a base model, and a verdict for each output format, before any work starts.

Everything here works on facts already read from disk (configs and tensor shapes), so it is pure and fast: the
services read ``adapter_config.json``, ``config.json`` and the safetensors headers, this module judges them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

_PEFT_PREFIX = "base_model.model."
_LORA_PARTS = (".lora_A.weight", ".lora_B.weight")
_DORA_PART = ".lora_magnitude_vector"


class OutputFormat(StrEnum):
    """What ``rentune export`` can write."""

    MERGED = "merged"
    GGUF = "gguf"
    LORA_GGUF = "lora_gguf"
    OLLAMA = "ollama"
    MLX = "mlx"


@dataclass(frozen=True)
class AdapterFacts:
    """What an adapter folder says about itself.

    Attributes:
        peft_type: ``LORA`` for the adapters Rentune trains.
        rank: LoRA rank ``r``.
        alpha: ``lora_alpha``.
        target_modules: Module names the adapter wraps.
        modules_to_save: Modules it stores whole (``embed_tokens``, ``lm_head``).
        tensors: Every tensor in its weights file and its shape.
        use_dora: A DoRA adapter (magnitude vectors beside the LoRA pairs).
    """

    peft_type: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    modules_to_save: tuple[str, ...]
    tensors: dict[str, tuple[int, ...]]
    use_dora: bool = False


@dataclass(frozen=True)
class BaseFacts:
    """What a base model folder says about itself.

    Attributes:
        architectures: ``config.json``'s ``architectures`` (``LlamaForCausalLM``).
        model_type: ``config.json``'s ``model_type`` (``llama``).
        tensors: Every weight and its shape.
    """

    architectures: tuple[str, ...]
    model_type: str
    tensors: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Verdict:
    """Whether one output can be made, and why not."""

    possible: bool
    reason: str = ""


@dataclass(frozen=True)
class Compatibility:
    """The check's outcome.

    Attributes:
        problems: Reasons the adapter cannot be used with this base at all (empty when it fits).
        verdicts: Per output format, whether it can be made.
    """

    problems: list[str]
    verdicts: dict[OutputFormat, Verdict] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """True when the adapter fits the base."""
        return not self.problems


@dataclass(frozen=True)
class Toolchain:
    """What the local tools support here.

    Attributes:
        gguf_architectures: Architectures llama.cpp's converter handles, or None when unknown (not installed).
        gguf_missing: Why GGUF cannot be made here when ``gguf_architectures`` is None.
        mlx_model_types: ``model_type`` values mlx-lm loads, or None when MLX is not available here.
        mlx_missing: Why MLX cannot be used here when ``mlx_model_types`` is None.
    """

    gguf_architectures: frozenset[str] | None
    gguf_missing: str = ""
    mlx_model_types: frozenset[str] | None = None
    mlx_missing: str = ""


def base_tensor_name(adapter_tensor: str) -> tuple[str, str]:
    """The base weight an adapter tensor belongs to and its role (``lora_A``, ``lora_B``, ``whole``, ``dora``).

    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` belongs to
    ``model.layers.0.self_attn.q_proj.weight``; a module saved whole keeps its own name.
    """
    name = adapter_tensor.removeprefix(_PEFT_PREFIX)
    for part in _LORA_PARTS:
        if name.endswith(part):
            return name.removesuffix(part) + ".weight", part.split(".")[1]
    if _DORA_PART in name:
        return name.split(_DORA_PART)[0] + ".weight", "dora"
    return name, "whole"


def _shape_problems(adapter: AdapterFacts, base: BaseFacts) -> list[str]:
    problems: list[str] = []
    for tensor, shape in sorted(adapter.tensors.items()):
        target, role = base_tensor_name(tensor)
        problem = _tensor_problem(target, role, shape, base.tensors.get(target), adapter.rank)
        if problem:
            problems.append(problem)
    return problems


def _tensor_problem(
    target: str, role: str, shape: tuple[int, ...], base_shape: tuple[int, ...] | None, rank: int
) -> str | None:
    if base_shape is None:
        return f"the base has no weight {target}"
    if role == "lora_A" and (len(shape) != 2 or shape[1] != base_shape[-1] or shape[0] != rank):
        return f"{target}: the adapter's lora_A is {list(shape)}, the base weight is {list(base_shape)}"
    if role == "lora_B" and (len(shape) != 2 or shape[0] != base_shape[0] or shape[1] != rank):
        return f"{target}: the adapter's lora_B is {list(shape)}, the base weight is {list(base_shape)}"
    if role == "whole" and shape != base_shape:
        return f"{target}: the adapter's copy is {list(shape)}, the base's is {list(base_shape)}"
    return None


def _adapter_problems(adapter: AdapterFacts) -> list[str]:
    if adapter.peft_type.upper() != "LORA":
        return [f"the adapter is {adapter.peft_type}, not LoRA; Rentune exports LoRA adapters"]
    if not any(base_tensor_name(name)[1] in ("lora_A", "lora_B") for name in adapter.tensors):
        return ["the adapter's weights file holds no LoRA tensors; the adapter folder is damaged or empty"]
    return []


def check_compatibility(adapter: AdapterFacts, base: BaseFacts, tools: Toolchain) -> Compatibility:
    """Whether ``adapter`` fits ``base``, and what can be made from them with ``tools``.

    Args:
        adapter: The adapter's facts.
        base: The base model's facts.
        tools: What llama.cpp and MLX support here.

    Returns:
        Problems (the first two shape mismatches, and how many more) and a verdict per output format.
    """
    problems = _adapter_problems(adapter)
    if not problems:
        mismatches = _shape_problems(adapter, base)
        if mismatches:
            more = f" (and {len(mismatches) - 2} more)" if len(mismatches) > 2 else ""
            problems = ["the adapter was trained on another base model: " + "; ".join(mismatches[:2]) + more]
    if problems:
        reason = problems[0]
        return Compatibility(problems, {fmt: Verdict(False, reason) for fmt in OutputFormat})
    return Compatibility([], _verdicts(adapter, base, tools))


def _verdicts(adapter: AdapterFacts, base: BaseFacts, tools: Toolchain) -> dict[OutputFormat, Verdict]:
    gguf = _gguf_verdict(base, tools)
    lora = gguf
    if gguf.possible and (adapter.modules_to_save or adapter.use_dora):
        whole = ", ".join(adapter.modules_to_save) or "DoRA magnitudes"
        lora = Verdict(False, f"a GGUF LoRA cannot carry the adapter's {whole}; the merged GGUF can")
    return {
        OutputFormat.MERGED: Verdict(True),
        OutputFormat.GGUF: gguf,
        OutputFormat.LORA_GGUF: lora,
        OutputFormat.OLLAMA: gguf,
        OutputFormat.MLX: _mlx_verdict(base, tools),
    }


def _gguf_verdict(base: BaseFacts, tools: Toolchain) -> Verdict:
    if tools.gguf_architectures is None:
        return Verdict(False, tools.gguf_missing or "llama.cpp's converter is not available here")
    unknown = [name for name in base.architectures if name not in tools.gguf_architectures]
    if not base.architectures or unknown:
        name = ", ".join(unknown) or "(config.json names no architecture)"
        return Verdict(False, f"llama.cpp cannot convert {name}; the merged model and MLX still work")
    return Verdict(True)


def _mlx_verdict(base: BaseFacts, tools: Toolchain) -> Verdict:
    if tools.mlx_model_types is None:
        return Verdict(False, tools.mlx_missing or "MLX is not available here")
    if base.model_type not in tools.mlx_model_types:
        why = f"mlx-lm cannot load model type {base.model_type!r}; the merged model and GGUF still work"
        return Verdict(False, why)
    return Verdict(True)


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def config_problems(adapter: AdapterFacts, config: dict[str, object]) -> list[str]:
    """Whether the adapter's tensors can belong to a model with this ``config.json``, before its weights are here.

    Every LoRA layer index must exist in the base, and every LoRA matrix's outer size must be one of the base's
    widths (hidden, intermediate, attention heads', key/value heads', vocabulary). Catches an adapter for another size
    of model; the exact shapes are compared once the weights are here (:func:`check_compatibility`).
    """
    widths = _widths(config)
    layers = config.get("num_hidden_layers")
    problems: list[str] = []
    for name, shape in sorted(adapter.tensors.items()):
        _target, role = base_tensor_name(name)
        layer = _LAYER.search(name)
        if isinstance(layers, int) and layer and int(layer.group(1)) >= layers:
            problems.append(f"{name} is in layer {layer.group(1)}, but the base has {layers} layers")
        outer = shape[1] if role == "lora_A" and len(shape) == 2 else shape[0] if role == "lora_B" and shape else None
        if widths and outer is not None and outer not in widths:
            problems.append(f"{name} is {outer} wide, which no weight of the base is ({sorted(widths)})")
    return problems


def _widths(config: dict[str, object]) -> set[int]:
    """The sizes a base's linear layers have, from its config (empty when it does not say)."""

    def number(key: str) -> int | None:
        value = config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    hidden, heads = number("hidden_size"), number("num_attention_heads")
    if hidden is None:
        return set()
    head_dim = number("head_dim") or (hidden // heads if heads else None)
    kv_heads = number("num_key_value_heads") or heads
    widths = {hidden, *filter(None, [number("intermediate_size"), number("vocab_size")])}
    if head_dim and heads:
        widths.add(head_dim * heads)
    if head_dim and kv_heads:
        widths.add(head_dim * kv_heads)
    return widths
