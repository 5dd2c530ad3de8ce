"""Merging an adapter into its base for real (PEFT in a child Python): logits checked, 16-bit, nothing partial."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from desktop.services.local.common import LocalInputError
from desktop.services.local.export import ExportRequest, check_export
from desktop.services.local.merge import merge_adapter
from tests.fixtures.adapters import PATTERN, TrainedAdapter
from tests.fixtures.tiny_models import build_tiny_model


def _greedy_answers(model_dir: Path, adapter: Path | None = None) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    answers = []
    for question, _ in PATTERN:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        out = model.generate(**ids, max_new_tokens=24, do_sample=False)
        answers.append(tokenizer.decode(out[0][ids["input_ids"].shape[1] :], skip_special_tokens=True).strip())
    return answers


def test_the_merged_model_answers_like_base_plus_adapter(pattern_adapter: TrainedAdapter, tmp_path: Path) -> None:
    steps: list[str] = []
    result = asyncio.run(
        merge_adapter(pattern_adapter.base, pattern_adapter.path, tmp_path / "merged", lambda t, _f: steps.append(t))
    )
    assert result.folder == tmp_path / "merged"
    assert result.merged_in == "float32" and result.dtype == "bfloat16"
    assert result.max_difference <= result.tolerance and result.top1_agreement == 1.0
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert (tmp_path / "merged" / "tokenizer.json").is_file()
    assert "im_start" in (tmp_path / "merged" / "chat_template.jinja").read_text()
    assert _greedy_answers(tmp_path / "merged") == [answer for _, answer in PATTERN]
    assert any("loading the base model" in step for step in steps)
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no temporary folder left beside it


def test_a_cancelled_merge_leaves_nothing(pattern_adapter: TrainedAdapter, tmp_path: Path) -> None:
    async def cancel_soon() -> None:
        task = asyncio.ensure_future(merge_adapter(pattern_adapter.base, pattern_adapter.path, tmp_path / "merged"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_soon())
    assert list(tmp_path.iterdir()) == []


def test_an_adapter_for_another_base_is_refused_before_any_work(
    pattern_adapter: TrainedAdapter, tmp_path: Path
) -> None:
    other = build_tiny_model(tmp_path / "wider", "qwen2", hidden=96)
    request = ExportRequest(pattern_adapter.path, str(other.path), tmp_path / "out", merged=True)
    with pytest.raises(LocalInputError, match=r"trained on another base model.*pass the --base it was trained on"):
        asyncio.run(check_export(request, other.path))
    assert not (tmp_path / "out").exists()


def test_a_corrupt_adapter_is_named(pattern_adapter: TrainedAdapter, tmp_path: Path) -> None:
    broken = tmp_path / "adapter"
    shutil.copytree(pattern_adapter.path, broken)
    weights = broken / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:3000])
    request = ExportRequest(broken, str(pattern_adapter.base), tmp_path / "out", merged=True)
    with pytest.raises(LocalInputError, match=r"adapter_model\.safetensors is damaged"):
        asyncio.run(check_export(request, pattern_adapter.base))
