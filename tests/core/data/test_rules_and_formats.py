from __future__ import annotations

import pytest

from desktop.core.data.findings import CODE_INFO, Code
from desktop.core.data.formats import (
    DataFormat,
    detect_format,
    from_alpaca,
    from_prompt_completion,
    from_sharegpt,
    to_alpaca,
    to_prompt_completion,
    to_sharegpt,
)
from desktop.core.data.report import token_stats
from desktop.core.data.rules import check_messages, exact_key, near_key
from desktop.core.data.split import eval_indices

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is LoRA?"},
    {"role": "assistant", "content": "Low-rank adapters."},
]


def test_every_code_has_a_title_and_a_fix() -> None:
    assert set(CODE_INFO) == set(Code)
    assert all(info.title and info.fix for info in CODE_INFO.values())


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        ({"messages": []}, DataFormat.MESSAGES),
        ({"conversations": []}, DataFormat.SHAREGPT),
        ({"instruction": "", "output": ""}, DataFormat.ALPACA),
        ({"prompt": "", "completion": ""}, DataFormat.PROMPT_COMPLETION),
        ({"x": 1}, None),
    ],
)
def test_format_detection(row: dict[str, object], fmt: DataFormat | None) -> None:
    assert detect_format(row) is fmt


def test_conversions_round_trip_to_the_same_messages() -> None:
    assert from_alpaca(to_alpaca(CONVERSATION)) == CONVERSATION
    assert from_sharegpt(to_sharegpt(CONVERSATION)) == CONVERSATION
    assert from_prompt_completion(to_prompt_completion(CONVERSATION)) == CONVERSATION
    assert from_prompt_completion({"prompt": "hi", "completion": "hello"}) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert from_alpaca({"instruction": "Sum", "input": "1 2", "output": "3"})[0] == {
        "role": "user",
        "content": "Sum\n\n1 2",
    }


def test_clean_conversation_has_no_findings() -> None:
    assert check_messages(CONVERSATION, 1) == []


def test_tool_call_turns_may_have_no_content() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "w"}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert check_messages(messages, 1) == []


def test_near_key_ignores_case_spacing_and_punctuation() -> None:
    other = [{**m, "content": m["content"].upper().replace(" ", "  ") + "!"} for m in CONVERSATION]
    assert near_key(other) == near_key(CONVERSATION)
    assert exact_key(other) != exact_key(CONVERSATION)


def test_token_stats() -> None:
    stats = token_stats([10, 20, 3000], seq_len=2048, method="m")
    assert (stats.total, stats.trained, stats.cut, stats.too_long) == (3030, 2078, 952, 1)
    assert stats.percentiles["max"] == 3000 and stats.percentiles["p50"] == 20
    assert dict(stats.histogram)["<=64"] == 2


def test_split_is_deterministic_stratified_and_sized() -> None:
    lengths = {row: (row * 37) % 1000 for row in range(1, 2001)}
    first = eval_indices(lengths, 0.1, seed=7)
    assert first == eval_indices(lengths, 0.1, seed=7)
    assert first != eval_indices(lengths, 0.1, seed=8)
    assert len(first) == 200
    short = [r for r in first if lengths[r] < 500]
    assert 80 <= len(short) <= 120, "eval rows come from short and long examples alike"
    assert eval_indices(lengths, 0.0, seed=7) == set()
    assert len(eval_indices({1: 5, 2: 6, 3: 7}, 0.34, seed=1)) == 1
