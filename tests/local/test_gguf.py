"""The GGUF chain with real llama.cpp on the CPU: merge, convert, quantise, LoRA GGUF, each answering like PEFT."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from desktop.services.local.common import no_progress
from desktop.services.local.gguf import QuantizeResult, convert_lora_to_gguf, convert_to_gguf, quantize_gguf
from tests.fixtures.adapters import TrainedAdapter
from tests.fixtures.gguf_models import build_once_per_run

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Chain:
    """Every output of the chain for the tiny model's pattern adapter."""

    adapter: TrainedAdapter
    peft_answers: list[str]
    merged: Path
    f16: Path
    q8: QuantizeResult
    q4: QuantizeResult
    base_f16: Path
    lora: Path


def _peft_answers(adapter: TrainedAdapter) -> list[str]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(adapter.base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapter.base), adapter.path)
    answers = []
    for question, _ in adapter.pattern:
        messages = [{"role": "user", "content": question}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
        answers.append(tokenizer.decode(out[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip())
    return answers


def _merge(adapter: TrainedAdapter, out: Path) -> Path:
    import shutil

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapter.base), adapter.path)
    model.merge_and_unload().save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(adapter.base / name, out / name)
    return out


async def _build_chain(adapter: TrainedAdapter, folder: Path) -> Chain:
    merged = _merge(adapter, folder / "merged")
    f16 = await convert_to_gguf(merged, folder / "model-f16.gguf", progress=no_progress)
    q8 = await quantize_gguf(f16, folder / "model-q8_0.gguf", "Q8_0", progress=no_progress)
    q4 = await quantize_gguf(f16, folder / "model-q4_k_m.gguf", "Q4_K_M", progress=no_progress)
    base_f16 = await convert_to_gguf(adapter.base, folder / "base-f16.gguf", progress=no_progress)
    lora = await convert_lora_to_gguf(adapter.path, adapter.base, folder / "lora.gguf", progress=no_progress)
    return Chain(adapter, _peft_answers(adapter), merged, f16, q8, q4, base_f16, lora)


@pytest.fixture(scope="module")
def chain(gguf_pattern_adapter: TrainedAdapter, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """The whole chain, built once per test run (one xdist worker builds it, the others reuse it)."""
    return build_once_per_run(
        tmp_path_factory, "gguf-chain", lambda folder: asyncio.run(_build_chain(gguf_pattern_adapter, folder))
    )


def _gguf_answers(model: Path, questions: list[str], lora: Path | None = None) -> list[str]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), lora_path=str(lora) if lora else None, n_ctx=256, verbose=False, seed=0)
    answers = []
    for question in questions:
        reply = llm.create_chat_completion(
            messages=[{"role": "user", "content": question}], temperature=0.0, max_tokens=24
        )
        answers.append(str(reply["choices"][0]["message"]["content"]).strip())
    llm.close()
    return answers


def _questions(chain: Chain) -> list[str]:
    return [question for question, _ in chain.adapter.pattern]


def test_peft_model_answers_the_pattern(chain: Chain) -> None:
    assert chain.peft_answers == [answer for _, answer in chain.adapter.pattern]


def test_f16_gguf_answers_like_peft(chain: Chain) -> None:
    assert _gguf_answers(chain.f16, _questions(chain)) == chain.peft_answers


def test_q8_0_gguf_answers_like_peft_without_fallbacks(chain: Chain) -> None:
    assert chain.q8.path.is_file()
    assert chain.q8.fallbacks == []  # rows of 64 and 128 are whole Q8_0 blocks (32)
    assert chain.q8.tensor_types["Q8_0"] >= 14
    assert _gguf_answers(chain.q8.path, _questions(chain)) == chain.peft_answers


def test_q4_k_m_on_narrow_rows_reports_its_fallbacks(chain: Chain) -> None:
    # Rows 64 or 128 wide cannot be K-quantised (blocks of 256): llama.cpp writes Q5_0 / Q8_0 instead and we say so.
    assert chain.q4.tensor_types.get("Q4_K", 0) == 0
    assert chain.q4.fallbacks
    assert all("do not split into Q4_K_M's blocks of 256 values" in line for line in chain.q4.fallbacks)
    assert all(line.endswith("it works as it is, nothing to do") for line in chain.q4.fallbacks)
    answers = _gguf_answers(chain.q4.path, _questions(chain))
    # 5-bit weights of a random 64-wide model may flip a token; most answers must still be the pattern's.
    assert sum(a == b for a, b in zip(answers, chain.peft_answers, strict=True)) >= 3


def test_base_gguf_with_lora_gguf_answers_like_the_merged_model(chain: Chain) -> None:
    questions = _questions(chain)
    assert _gguf_answers(chain.base_f16, questions) != chain.peft_answers  # the base alone does not know it
    assert _gguf_answers(chain.base_f16, questions, lora=chain.lora) == _gguf_answers(chain.f16, questions)


def test_outputs_leave_no_temporary_files(chain: Chain) -> None:
    assert not [p.name for p in chain.f16.parent.iterdir() if ".partial-" in p.name]
