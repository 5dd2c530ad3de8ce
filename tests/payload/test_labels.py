"""The payload trains on every assistant turn, whatever the chat template: real Llama 3, Qwen2, Mistral and Phi-3
tokenizers and templates (from llama.cpp's vocab GGUFs, see tests/fixtures/real_tokenizers.py) and the tiny ChatML.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.real_tokenizers import RealTokenizers
from tests.fixtures.tiny_models import CHATML_TEMPLATE, TINY_TRAINING, TinyModel
from trainer_payload.failures import DataError
from trainer_payload.labels import IGNORE_INDEX, label_conversation, label_rows

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant that adds numbers."},
    {"role": "user", "content": "What is two plus three?"},
    {"role": "assistant", "content": "two plus three is 5."},
    {"role": "user", "content": "And four plus four?"},
    {"role": "assistant", "content": "four plus four is 8."},
    {"role": "user", "content": "Thanks! Nine plus one?"},
    {"role": "assistant", "content": "nine plus one is 10."},
]
ANSWERS = [m["content"] for m in CONVERSATION if m["role"] == "assistant"]

# The first test to ask for real_tokenizers on a machine downloads and converts them (a few minutes on 2 busy cores).
pytestmark = pytest.mark.timeout(1200)

# Mistral-7B-Instruct-v0.3's template without its tool branches: the system prompt goes into the last user turn
# (so into none in a conversation that ends with the assistant), and a space before each answer.
MISTRAL_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] | trim + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported') }}{%- endif %}"
    "{%- endfor %}"
)
CHATML_WITHOUT_MARKERS = CHATML_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")

# (tokenizer, template: a file of the sdist, a string, or None for the tokenizer's own, end of turn of every answer)
CASES: dict[str, tuple[str, str | None, list[str]]] = {
    "llama3": ("llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja", ["<|eot_id|>"] * 3),
    "qwen2": ("qwen2", None, ["<|im_end|>"] * 3),
    "qwen2.5": ("qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja", ["<|im_end|>"] * 3),
    "mistral": ("llama-spm", MISTRAL_TEMPLATE, ["</s>"] * 3),
    "mistral-nemo": ("llama-spm", "mistralai-Mistral-Nemo-Instruct-2407.jinja", ["</s>"] * 3),
    "phi3": ("phi3", None, ["<|end|>"] * 3),
    # Phi-3.5 ends the conversation, not each turn, with the EOS token: the last answer learns both (Phi-3's
    # SentencePiece vocabulary writes that newline as "▁" + "\n", which decodes as " \n").
    "phi3.5": ("phi3", "microsoft-Phi-3.5-mini-instruct.jinja", ["<|end|>", "<|end|>", "<|end|> \n<|endoftext|>"]),
}


def load_case(real_tokenizers: RealTokenizers, name: str) -> tuple[Any, list[str]]:
    vocab, template, ends = CASES[name]
    if template is not None and template.endswith(".jinja"):
        template = real_tokenizers.template(template)
    return real_tokenizers.tokenizer(vocab, template), ends


def labelled_runs(tokenizer: Any, example: dict[str, list[int]]) -> list[str]:
    """The decoded stretches of consecutive labelled tokens, after checking each label is its own input id."""
    runs: list[list[int]] = [[]]
    for token, label in zip(example["input_ids"], example["labels"], strict=True):
        assert label in (token, IGNORE_INDEX)
        if label != IGNORE_INDEX:
            runs[-1].append(token)
        elif runs[-1]:
            runs.append([])
    return [tokenizer.decode(run) for run in runs if run]


def tiny_tokenizer(model: TinyModel, template: str = CHATML_TEMPLATE) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.path)
    tokenizer.chat_template = template
    return tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_every_assistant_turn_and_its_end_of_turn_are_labelled(real_tokenizers: RealTokenizers, case: str) -> None:
    tokenizer, ends = load_case(real_tokenizers, case)
    example = label_conversation(tokenizer, CONVERSATION, seq_len=4096)
    assert labelled_runs(tokenizer, example) == [answer + end for answer, end in zip(ANSWERS, ends, strict=True)]
    rendered = tokenizer.apply_chat_template(CONVERSATION, return_dict=True)["input_ids"]
    assert example["input_ids"] == rendered, "the ids are the whole conversation, tokenised as the template gives it"


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, CHATML_WITHOUT_MARKERS], ids=["markers", "no-markers"])
def test_tiny_chatml_labels_match_its_generation_markers(tiny_model: TinyModel, template: str) -> None:
    tokenizer = tiny_tokenizer(tiny_model, template)
    example = label_conversation(tokenizer, CONVERSATION, seq_len=4096)
    marked = tiny_tokenizer(tiny_model).apply_chat_template(
        CONVERSATION, return_dict=True, return_assistant_tokens_mask=True
    )
    assert example["input_ids"] == marked["input_ids"]
    assert [label != IGNORE_INDEX for label in example["labels"]] == [bool(m) for m in marked["assistant_masks"]]
    assert labelled_runs(tokenizer, example) == [answer + "<|im_end|>" for answer in ANSWERS]


def test_a_tokenizer_without_offsets_is_labelled_piece_by_piece() -> None:
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer(extra_ids=0)  # a pure-Python tokenizer: no offset mapping
    tokenizer.chat_template = CHATML_WITHOUT_MARKERS.replace("<|im_end|>", "</s>")
    assert not tokenizer.is_fast
    example = label_conversation(tokenizer, CONVERSATION, seq_len=4096)
    assert labelled_runs(tokenizer, example) == [answer + "</s>" for answer in ANSWERS]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama3", "mistral"])
def test_truncation_keeps_ids_and_labels_aligned(real_tokenizers: RealTokenizers, case: str) -> None:
    tokenizer, ends = load_case(real_tokenizers, case)
    whole = label_conversation(tokenizer, CONVERSATION, seq_len=4096)
    labelled = [i for i, label in enumerate(whole["labels"]) if label != IGNORE_INDEX]
    second_answer = next(i for previous, i in itertools.pairwise(labelled) if i > previous + 1)
    for seq_len in (1, 12, second_answer, second_answer + 3, len(whole["input_ids"]) - 1):
        cut = label_conversation(tokenizer, CONVERSATION, seq_len=seq_len)
        assert cut == {key: ids[:seq_len] for key, ids in whole.items()}
    cut = label_conversation(tokenizer, CONVERSATION, seq_len=second_answer + 3)
    assert labelled_runs(tokenizer, cut)[0] == ANSWERS[0] + ends[0]
    assert len(labelled_runs(tokenizer, cut)) == 2, "the second answer is cut after its first tokens"


def test_rows_whose_answers_lie_past_seq_len_are_dropped_and_counted(tiny_model: TinyModel) -> None:
    tokenizer = tiny_tokenizer(tiny_model, CHATML_WITHOUT_MARKERS)
    long_prompt = [{"role": "user", "content": "two plus three " * 40}, {"role": "assistant", "content": "5."}]
    examples, dropped = label_rows(tokenizer, [{"messages": CONVERSATION}, {"messages": long_prompt}], 64, "t.jsonl")
    assert (len(examples), dropped) == (1, 1)
    assert all(len(example["input_ids"]) <= 64 for example in examples)
    with pytest.raises(DataError, match=r"t\.jsonl: no example has an assistant token within the first 64 tokens"):
        label_rows(tokenizer, [{"messages": long_prompt}], 64, "t.jsonl")


@pytest.mark.slow
def test_a_template_that_rejects_a_conversation_names_the_example(real_tokenizers: RealTokenizers) -> None:
    tokenizer = real_tokenizers.tokenizer("llama3", real_tokenizers.template("google-gemma-2-2b-it.jinja"))
    rows = [{"messages": CONVERSATION[1:]}, {"messages": CONVERSATION}]
    with pytest.raises(DataError, match=r"train.jsonl: example 2: .*chat template rejects.*System role not supported"):
        label_rows(tokenizer, rows, 256, "train.jsonl")


def test_a_tokenizer_without_chat_template_is_one_clear_error(tiny_model: TinyModel) -> None:
    tokenizer = tiny_tokenizer(tiny_model)
    tokenizer.chat_template = None
    with pytest.raises(DataError, match="example 1: the model's tokenizer has no chat template"):
        label_rows(tokenizer, [{"messages": CONVERSATION}], 256, "train.jsonl")


@pytest.mark.slow
def test_sft_trainer_trains_on_every_turn_of_a_template_without_markers(tiny_model: TinyModel, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    from trainer_payload.protocol import JobSpec
    from trainer_payload.train import _datasets, _sft_config

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"messages": CONVERSATION}) + "\n" for _ in range(4)), encoding="utf-8")
    spec = JobSpec.from_dict(
        {**TINY_TRAINING, "base_model": str(tiny_model.path), "train_file": str(train), "output_dir": str(tmp_path)}
    )
    tokenizer = tiny_tokenizer(tiny_model, CHATML_WITHOUT_MARKERS)
    train_set, _evaluation, dropped = _datasets(spec, tokenizer)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model.path),
        args=_sft_config(spec, bf16=False, has_eval=False),
        train_dataset=train_set,
        processing_class=tokenizer,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    assert dropped == 0
    expected = [answer + "<|im_end|>" for answer in ANSWERS]
    for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True):
        assert labelled_runs(tokenizer, {"input_ids": ids, "labels": labels}) == expected
