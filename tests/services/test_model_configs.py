from __future__ import annotations

from typing import Any

import pytest

from desktop.services.models.configs import ModelResolutionError, load_catalog, load_gpus, resolve_model

QWEN3_CONFIG = {
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
}


def test_bundled_catalog_and_gpus_load() -> None:
    assert len(load_catalog()) >= 25
    names = {gpu.name for gpu in load_gpus()}
    for required in (
        "RTX 3090",
        "RTX 4090",
        "RTX 5090",
        "A10",
        "L4",
        "L40S",
        "RTX A6000",
        "A100 40GB",
        "A100 80GB",
        "H100 PCIe",
        "H100 SXM",
        "H200",
        "B200",
        "MI300X",
    ):
        assert required in names


def test_hub_ids_outside_the_catalog_are_fetched() -> None:
    asked: list[str] = []

    def fetch(repo_id: str) -> dict[str, Any]:
        asked.append(repo_id)
        return QWEN3_CONFIG

    arch = resolve_model("someone/my-qwen3-finetune", fetch=fetch)
    assert asked == ["someone/my-qwen3-finetune"]
    assert arch.total_params / 1e9 == pytest.approx(8.19, abs=0.02)


def test_catalog_wins_over_the_hub() -> None:
    def fetch(repo_id: str) -> dict[str, Any]:
        raise AssertionError("the catalog should have answered")

    assert resolve_model("Qwen/Qwen2.5-7B-Instruct", fetch=fetch).name == "Qwen/Qwen2.5-7B-Instruct"


def test_names_that_are_no_hub_id_fail_with_suggestions() -> None:
    with pytest.raises(ModelResolutionError, match="did you mean"):
        resolve_model("mistral 7")
