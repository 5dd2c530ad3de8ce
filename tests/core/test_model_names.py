"""A model folder's path is named by what it holds, so lists and titles keep the telling part of it."""

from __future__ import annotations

import pytest

from desktop.core.model_names import is_local_model, model_name

SNAPSHOT = (
    "/home/alexandra/models/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/"
    "12fd25f77366fa6b3b4b768ec3050bf629380bac"
)


@pytest.mark.parametrize(
    ("base", "named"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        ("gpt2", "gpt2"),
        (SNAPSHOT, "HuggingFaceTB/SmolLM2-135M-Instruct (local folder)"),
        ("/data/models/my-llama-8b/", "my-llama-8b (local folder)"),
        ("~/models/tiny", "tiny (local folder)"),
        ("./tiny", "tiny (local folder)"),
        ("C:\\Users\\ana\\models\\Qwen2.5-0.5B", "Qwen2.5-0.5B (local folder)"),
    ],
)
def test_a_model_is_named_by_its_hub_id_or_its_folder(base: str, named: str) -> None:
    assert model_name(base) == named
    assert is_local_model(base) is named.endswith("(local folder)")


def test_a_folder_name_can_leave_out_the_mark() -> None:
    assert model_name(SNAPSHOT, mark_local=False) == "HuggingFaceTB/SmolLM2-135M-Instruct"
