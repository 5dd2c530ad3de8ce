"""Model architectures: the config fields the estimator needs, and parameter counts computed from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ArchitectureError(ValueError):
    """A model config lacks a field the estimator needs, or holds a value that makes no sense."""


@dataclass(frozen=True)
class LinearShape:
    """One kind of linear layer inside a transformer block.

    Attributes:
        name: The module name used by PEFT ``target_modules`` (``q_proj``, ``down_proj``...).
        in_features: Input width.
        out_features: Output width.
        attention: Whether it belongs to attention (``--targets attention`` adapts only these).
        per_expert: Whether one copy exists per MoE expert.
    """

    name: str
    in_features: int
    out_features: int
    attention: bool
    per_expert: bool = False

    @property
    def params(self) -> int:
        """Weights of one copy (biases are negligible and ignored)."""
        return self.in_features * self.out_features


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only transformer.

    Attributes:
        name: Display name (a Hub id, a catalog alias or a folder).
        hidden_size: Width of the residual stream.
        num_layers: Transformer blocks.
        num_heads: Attention (query) heads.
        num_kv_heads: Key/value heads (fewer than ``num_heads`` with GQA/MQA).
        head_dim: Width of one head.
        intermediate_size: Width of the MLP (of one expert for MoE models).
        vocab_size: Tokens in the vocabulary (rows of the embedding and of the LM head).
        tied_embeddings: Whether the LM head shares the embedding matrix.
        gated_mlp: SwiGLU/GeGLU MLP with gate, up and down projections (else up and down only).
        num_experts: MoE experts per layer (1 for a dense model).
        experts_per_token: Experts each token is routed to.
        max_context: Longest sequence the model was trained for (0 when unknown).
        model_type: The Hugging Face ``model_type``.
        parallel_block: Attention and MLP read the same normalised input (one norm per block: Phi, GPT-NeoX,
            Falcon).
        norms_per_block: Normalisation layers per block (Gemma 2/3 normalise before and after each sub-layer).
        logit_softcap: The logits pass through ``cap * tanh(x / cap)`` (Gemma 2), which keeps fp32 copies.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = False
    gated_mlp: bool = True
    num_experts: int = 1
    experts_per_token: int = 1
    max_context: int = 0
    model_type: str = "llama"
    parallel_block: bool = False
    norms_per_block: int = 2
    logit_softcap: bool = False

    @property
    def q_width(self) -> int:
        """Width of all query heads together."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of all key (or value) heads together."""
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> list[LinearShape]:
        """Returns the linear layers of one block, as PEFT names them (Llama naming)."""
        h, i = self.hidden_size, self.intermediate_size
        moe = self.num_experts > 1
        shapes = [
            LinearShape("q_proj", h, self.q_width, attention=True),
            LinearShape("k_proj", h, self.kv_width, attention=True),
            LinearShape("v_proj", h, self.kv_width, attention=True),
            LinearShape("o_proj", self.q_width, h, attention=True),
        ]
        if self.gated_mlp:
            shapes.append(LinearShape("gate_proj", h, i, attention=False, per_expert=moe))
        shapes.append(LinearShape("up_proj", h, i, attention=False, per_expert=moe))
        shapes.append(LinearShape("down_proj", i, h, attention=False, per_expert=moe))
        return shapes

    def block_linear_params(self) -> int:
        """Weights of all linear layers of one block (every expert counted)."""
        return sum(s.params * (self.num_experts if s.per_expert else 1) for s in self.linear_shapes())

    def active_block_linear_params(self) -> int:
        """Weights one token passes through in one block (only its routed experts for MoE)."""
        return sum(s.params * (self.experts_per_token if s.per_expert else 1) for s in self.linear_shapes())

    @property
    def linear_params(self) -> int:
        """Weights in the blocks' linear layers: what QLoRA quantises and LoRA can adapt."""
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        return self.num_layers * (self.block_linear_params() + router)

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head when it is not tied."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def norm_params(self) -> int:
        """RMSNorm/LayerNorm weights (two per block and a final one)."""
        return (2 * self.num_layers + 1) * self.hidden_size

    @property
    def total_params(self) -> int:
        """All parameters."""
        return self.linear_params + self.embedding_params + self.norm_params

    @property
    def active_params(self) -> int:
        """Parameters used per token (equals :attr:`total_params` for dense models)."""
        dense_rest = self.embedding_params + self.norm_params
        return self.num_layers * self.active_block_linear_params() + dense_rest


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def _positive_int(config: Mapping[str, Any], name: str, *keys: str) -> int:
    value = _first(config, *keys)
    if value is None:
        raise ArchitectureError(f"{name}: the config has none of {', '.join(keys)}; it is not a decoder LLM config")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArchitectureError(f"{name}: {keys[0]}={value!r} must be a positive integer")
    return value


_NON_GATED = {"gpt_neox", "gpt2", "falcon", "phi", "gpt_bigcode", "stablelm_alpha", "opt", "bloom", "mpt"}
_PARALLEL = {"gpt_neox", "phi", "falcon", "stablelm_alpha"}
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "falcon", "phi"}


def architecture_from_config(config: Mapping[str, Any], name: str) -> Architecture:
    """Reads an architecture from a Hugging Face ``config.json`` (decoder-only LLMs; multimodal text towers too).

    Args:
        config: The decoded ``config.json``.
        name: What to call the model in messages and output.

    Raises:
        ArchitectureError: A needed field is missing or invalid; the message names it.
    """
    if isinstance(config.get("text_config"), Mapping):
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "")}
    model_type = str(config.get("model_type", "") or "")
    hidden = _positive_int(config, "hidden size", "hidden_size", "n_embd", "d_model")
    heads = _positive_int(config, "attention heads", "num_attention_heads", "n_head", "num_heads")
    if config.get("multi_query") and not config.get("new_decoder_architecture"):
        kv_heads = 1
    else:
        kv_heads = _first(config, "num_key_value_heads", "num_kv_heads", "n_head_kv") or heads
    head_dim = _first(config, "head_dim") or hidden // heads
    gated = model_type not in _NON_GATED
    default_ffn = 4 * hidden
    intermediate = _first(config, "moe_intermediate_size", "intermediate_size", "ffn_hidden_size", "n_inner")
    if model_type == "qwen" and intermediate:
        intermediate //= 2  # original Qwen stores the two halves of its gated MLP as one width
    experts = _first(config, "num_local_experts", "num_experts", "n_routed_experts") or 1
    arch = Architecture(
        name=name,
        hidden_size=hidden,
        num_layers=_positive_int(config, "layers", "num_hidden_layers", "n_layer", "num_layers"),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(intermediate or default_ffn),
        vocab_size=_positive_int(config, "vocabulary size", "vocab_size", "padded_vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        gated_mlp=gated,
        num_experts=int(experts),
        experts_per_token=int(_first(config, "num_experts_per_tok", "moe_topk") or (2 if experts > 1 else 1)),
        max_context=int(_first(config, "max_position_embeddings", "n_positions", "seq_length") or 0),
        model_type=model_type or "unknown",
        parallel_block=model_type in _PARALLEL and config.get("use_parallel_residual", True) is not False,
        norms_per_block=4 if model_type in {"gemma2", "gemma3", "gemma3_text"} else 2,
        logit_softcap=bool(config.get("final_logit_softcapping", 30.0 if model_type == "gemma2" else None)),
    )
    _validate(arch)
    return arch


def _validate(arch: Architecture) -> None:
    if arch.num_heads % arch.num_kv_heads:
        raise ArchitectureError(f"{arch.num_heads} attention heads cannot be grouped over {arch.num_kv_heads} KV heads")
    if arch.experts_per_token > arch.num_experts:
        raise ArchitectureError(f"{arch.experts_per_token} experts per token but only {arch.num_experts} experts")
