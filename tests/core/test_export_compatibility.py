"""The compatibility check's verdicts, from facts alone (no files)."""

from __future__ import annotations

from desktop.core.export.compatibility import (
    AdapterFacts,
    BaseFacts,
    OutputFormat,
    Toolchain,
    base_tensor_name,
    check_compatibility,
)

_Q = "model.layers.0.self_attn.q_proj"
BASE = BaseFacts(("LlamaForCausalLM",), "llama", {f"{_Q}.weight": (64, 64), "model.embed_tokens.weight": (512, 64)})
TOOLS = Toolchain(frozenset({"LlamaForCausalLM"}), "", frozenset({"llama"}), "")


def _adapter(
    rank: int = 8, out: int = 64, extra: dict[str, tuple[int, ...]] | None = None, **kw: object
) -> AdapterFacts:
    tensors = {
        f"base_model.model.{_Q}.lora_A.weight": (rank, 64),
        f"base_model.model.{_Q}.lora_B.weight": (out, rank),
        **(extra or {}),
    }
    return AdapterFacts("LORA", rank, 2.0 * rank, ("q_proj",), kw.pop("save", ()), tensors, **kw)  # type: ignore[arg-type]


def test_peft_names_map_to_the_base_weights() -> None:
    assert base_tensor_name(f"base_model.model.{_Q}.lora_B.weight") == (f"{_Q}.weight", "lora_B")
    assert base_tensor_name("base_model.model.lm_head.weight") == ("lm_head.weight", "whole")


def test_a_fitting_adapter_can_become_every_output() -> None:
    result = check_compatibility(_adapter(), BASE, TOOLS)
    assert result.fits
    assert all(verdict.possible for verdict in result.verdicts.values())


def test_an_adapter_for_another_base_is_refused_naming_the_weight() -> None:
    result = check_compatibility(_adapter(out=96), BASE, TOOLS)
    assert not result.fits
    assert "another base model" in result.problems[0] and f"{_Q}.weight" in result.problems[0]
    assert not any(verdict.possible for verdict in result.verdicts.values())


def test_a_weight_the_base_lacks_is_named() -> None:
    extra = {"base_model.model.model.layers.9.mlp.up_proj.lora_A.weight": (8, 64)}
    assert (
        "has no weight model.layers.9.mlp.up_proj.weight"
        in check_compatibility(_adapter(extra=extra), BASE, TOOLS).problems[0]
    )


def test_an_architecture_llama_cpp_cannot_convert_still_merges() -> None:
    base = BaseFacts(("FooForCausalLM",), "foo", BASE.tensors)
    verdicts = check_compatibility(_adapter(), base, TOOLS).verdicts
    assert verdicts[OutputFormat.MERGED].possible
    assert not verdicts[OutputFormat.GGUF].possible
    assert "llama.cpp cannot convert FooForCausalLM" in verdicts[OutputFormat.GGUF].reason
    assert "merged model and MLX still work" in verdicts[OutputFormat.GGUF].reason
    assert "mlx-lm cannot load model type 'foo'" in verdicts[OutputFormat.MLX].reason


def test_saved_embeddings_rule_out_only_the_gguf_lora() -> None:
    extra = {"base_model.model.model.embed_tokens.weight": (512, 64)}
    verdicts = check_compatibility(_adapter(extra=extra, save=("embed_tokens",)), BASE, TOOLS).verdicts
    assert verdicts[OutputFormat.GGUF].possible
    assert not verdicts[OutputFormat.LORA_GGUF].possible
    assert "embed_tokens" in verdicts[OutputFormat.LORA_GGUF].reason


def test_a_resized_vocabulary_is_a_mismatch() -> None:
    extra = {"base_model.model.model.embed_tokens.weight": (520, 64)}
    problems = check_compatibility(_adapter(extra=extra, save=("embed_tokens",)), BASE, TOOLS).problems
    assert "[520, 64]" in problems[0] and "[512, 64]" in problems[0]


def test_missing_tools_say_why() -> None:
    tools = Toolchain(None, "llama-cpp-python is not installed", None, "MLX needs Apple Silicon")
    verdicts = check_compatibility(_adapter(), BASE, tools).verdicts
    assert verdicts[OutputFormat.GGUF].reason == "llama-cpp-python is not installed"
    assert verdicts[OutputFormat.MLX].reason == "MLX needs Apple Silicon"


def test_a_non_lora_adapter_is_refused() -> None:
    adapter = AdapterFacts("IA3", 0, 0.0, (), (), {"base_model.model.x.ia3_l": (64,)})
    assert "IA3, not LoRA" in check_compatibility(adapter, BASE, TOOLS).problems[0]
