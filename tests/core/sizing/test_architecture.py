from __future__ import annotations

import pytest

from desktop.core.sizing.architecture import ArchitectureError, architecture_from_config
from desktop.core.sizing.catalog import ModelCatalog

# Published parameter counts (billions) of the real checkpoints; ours are computed from the config fields.
PUBLISHED_B = {
    "meta-llama/Llama-3.2-1B-Instruct": 1.236,
    "meta-llama/Llama-3.1-8B-Instruct": 8.030,
    "meta-llama/Llama-3.3-70B-Instruct": 70.554,
    "Qwen/Qwen2.5-7B-Instruct": 7.616,
    "Qwen/Qwen2.5-72B-Instruct": 72.706,
    "Qwen/Qwen3-8B": 8.191,
    "mistralai/Mistral-7B-Instruct-v0.3": 7.248,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 46.703,
    "google/gemma-2-9b-it": 9.242,
    "microsoft/Phi-3-mini-4k-instruct": 3.821,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 0.135,
    "meta-llama/Llama-2-7b-hf": 6.738,
}


def test_catalog_holds_at_least_25_popular_models(catalog: ModelCatalog) -> None:
    assert len(catalog) >= 25
    families = {entry.family for entry in catalog}
    for family in (
        "Llama 3.1",
        "Llama 3.2",
        "Qwen 2.5",
        "Qwen 3",
        "Mistral",
        "Mixtral",
        "Gemma 2",
        "Gemma 3",
        "Phi-3",
        "Phi-4",
        "SmolLM2",
        "DeepSeek-R1 distill",
    ):
        assert family in families


@pytest.mark.parametrize(("model_id", "published"), PUBLISHED_B.items())
def test_parameter_counts_match_the_published_ones(catalog: ModelCatalog, model_id: str, published: float) -> None:
    arch = catalog.find(model_id)
    assert arch is not None
    assert arch.total_params / 1e9 == pytest.approx(published, rel=0.01)


def test_moe_active_parameters(catalog: ModelCatalog) -> None:
    mixtral = catalog.find("mixtral-8x7b")
    assert mixtral is not None
    assert mixtral.active_params / 1e9 == pytest.approx(12.9, rel=0.02)


def test_lookup_by_alias_short_id_and_case(catalog: ModelCatalog) -> None:
    assert catalog.find("LLAMA-3.1-8B") is catalog.find("Llama-3.1-8B-Instruct") is not None
    assert catalog.find("no-such-model") is None
    assert "Qwen/Qwen2.5-7B-Instruct" in catalog.suggestions("qwen 7b")


def test_multimodal_text_config_is_used() -> None:
    arch = architecture_from_config(
        {
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 2560,
                "num_hidden_layers": 34,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "intermediate_size": 10240,
                "vocab_size": 262208,
            },
        },
        "gemma-3-4b",
    )
    assert arch.num_layers == 34 and arch.norms_per_block == 4


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10}, "hidden size"),
        ({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}, "layers"),
        ({"hidden_size": 64, "num_hidden_layers": -2, "num_attention_heads": 4, "vocab_size": 10}, "positive"),
        (
            {
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 3,
                "vocab_size": 10,
            },
            "KV heads",
        ),
    ],
)
def test_bad_configs_name_the_problem(config: dict[str, object], message: str) -> None:
    with pytest.raises(ArchitectureError, match=message):
        architecture_from_config(config, "x")
