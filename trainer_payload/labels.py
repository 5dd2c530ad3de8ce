"""Token labels for every assistant turn of a conversation, with any chat template.

The conversation is rendered once with the tokenizer's chat template. Each assistant message's text is found by
rendering the conversation again with that message's content swapped for a placeholder character: the two renders
differ exactly where the template wrote the content, wherever that is (no ``{% generation %}`` markers needed, and
templates that move the system prompt or drop earlier reasoning are handled alike). The end-of-turn text the template
writes after the final assistant message (``<|eot_id|>``, ``<|im_end|>``, ``</s>``...) is labelled after every
assistant message it follows, so the model learns to stop. Labels are -100 everywhere else.

Tokenisation happens once, before training; training then reads ``input_ids`` and ``labels`` as they are.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from typing import Any

from trainer_payload.failures import DataError

IGNORE_INDEX = -100
# Private-use characters never written by a template: where a render with one of them differs from the real render
# is the message's own text. Two, so one always differs from the content's first and last character.
_PLACEHOLDERS = ("\ue000", "\ue001")

Span = tuple[int, int]


def render(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The conversation as the chat template writes it (special tokens as text, no generation prompt).

    Raises:
        DataError: The tokenizer has no chat template, or its template fails on this conversation.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the model's tokenizer has no chat template; train an instruct or chat model")
    try:
        return str(tokenizer.apply_chat_template(messages, tokenize=False))
    except Exception as exc:  # a template is a program from the model's repository: any failure is its own
        raise DataError(f"the model's chat template rejects this conversation ({type(exc).__name__}: {exc})") from exc


def _shared_start(a: str, b: str) -> str:
    return os.path.commonprefix([a, b])  # noqa: RUF071 - character by character is the point (and runs in C)


def _placeholder_for(content: str) -> str:
    return next(p for p in _PLACEHOLDERS if p not in (content[:1], content[-1:]))


def content_span(tokenizer: Any, messages: list[dict[str, Any]], index: int, text: str) -> Span | None:
    """Where message ``index``'s content lies in ``text`` (the render of ``messages``); ``None`` if not written."""
    message = messages[index]
    probe_message = {**message, "content": _placeholder_for(message["content"])}
    probe = render(tokenizer, [*messages[:index], probe_message, *messages[index + 1 :]])
    if probe == text:
        return None  # the template leaves this message out
    start = len(_shared_start(text, probe))
    tail = min(len(_shared_start(text[::-1], probe[::-1])), len(text) - start, len(probe) - start)
    return start, len(text) - tail


def _end_of_turn(text: str, end: int, final: str) -> int:
    """Where the end-of-turn text after an assistant message ends; ``final`` is what follows the last one.

    Some templates close the last turn with more (Phi-3 adds the EOS token): the common part is kept, cut back to
    whole words so no piece of the next turn's header is trained on.
    """
    shared = _shared_start(final, text[end : end + len(final)])
    if shared != final:
        cut = max(shared.rfind(space) for space in " \n\t")
        shared = shared[:cut].rstrip() if cut > 0 else ""
    return end + len(shared)


def assistant_spans(tokenizer: Any, messages: list[dict[str, Any]], text: str) -> list[Span]:
    """Character spans of ``text`` to train on: each assistant message's content and its end-of-turn text.

    Args:
        tokenizer: A tokenizer with a chat template.
        messages: The conversation, ending with an assistant message.
        text: ``render(tokenizer, messages)``.

    Raises:
        DataError: The template rejects the conversation, or writes assistant messages out of their order.
    """
    contents = [
        span
        for index, message in enumerate(messages)
        if message["role"] == "assistant" and (span := content_span(tokenizer, messages, index, text))
    ]
    if not contents:
        return []
    # What follows the final assistant message is the template's end of turn; whitespace after it is layout.
    final = text[contents[-1][1] :].rstrip()
    spans: list[Span] = []
    for start, end in contents:
        if spans and start < spans[-1][1]:
            raise DataError("the model's chat template writes the assistant messages out of order")
        spans.append((start, _end_of_turn(text, end, final)))
    return spans


def _inside(offsets: Iterable[Span], spans: list[Span]) -> list[bool]:
    """For each token's character offsets, whether it overlaps one of the sorted ``spans``."""
    flags, k = [], 0
    for start, end in offsets:
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        flags.append(end > start and k < len(spans) and end > spans[k][0])
    return flags


def _tokenize_with_offsets(tokenizer: Any, text: str, spans: list[Span]) -> tuple[list[int], list[bool]]:
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(encoding["input_ids"]), _inside(encoding["offset_mapping"], spans)


def _tokenize_piecewise(tokenizer: Any, text: str, spans: list[Span]) -> tuple[list[int], list[bool]]:
    """For tokenizers without offsets: each stretch between span edges is tokenised on its own."""
    edges = sorted({0, len(text), *(edge for span in spans for edge in span)})
    ids: list[int] = []
    flags: list[bool] = []
    for start, end in itertools.pairwise(edges):
        piece = tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
        ids += piece
        flags += [any(s <= start and end <= e for s, e in spans)] * len(piece)
    return ids, flags


def label_conversation(tokenizer: Any, messages: list[dict[str, Any]], seq_len: int) -> dict[str, list[int]]:
    """``input_ids`` and ``labels`` (-100 outside the assistant turns) of one conversation, cut to ``seq_len``.

    Raises:
        DataError: The chat template rejects the conversation.
    """
    text = render(tokenizer, messages)
    spans = assistant_spans(tokenizer, messages, text)
    tokenize = _tokenize_with_offsets if getattr(tokenizer, "is_fast", False) else _tokenize_piecewise
    ids, trained = tokenize(tokenizer, text, spans)
    ids, trained = ids[:seq_len], trained[:seq_len]
    return {"input_ids": ids, "labels": [i if t else IGNORE_INDEX for i, t in zip(ids, trained, strict=True)]}


def label_rows(
    tokenizer: Any, rows: list[dict[str, Any]], seq_len: int, source: str
) -> tuple[list[dict[str, Any]], int]:
    """Labels every conversation; those left with nothing to train on after truncation are dropped and counted.

    Args:
        tokenizer: A tokenizer with a chat template.
        rows: ``{"messages": [...]}`` rows from ``load_messages``.
        seq_len: Tokens kept per example.
        source: The file name, for error messages.

    Returns:
        The labelled examples, and how many rows were dropped.

    Raises:
        DataError: A conversation the template rejects (named by its example number), or no example left.
    """
    examples = []
    for number, row in enumerate(rows, start=1):
        try:
            example = label_conversation(tokenizer, row["messages"], seq_len)
        except DataError as exc:
            raise DataError(f"{source}: example {number}: {exc}") from exc
        if any(label != IGNORE_INDEX for label in example["labels"]):
            examples.append(example)
    if not examples:
        raise DataError(
            f"{source}: no example has an assistant token within the first {seq_len} tokens; raise seq_len or "
            "shorten the prompts"
        )
    return examples, len(rows) - len(examples)
