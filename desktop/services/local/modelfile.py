"""An Ollama ``Modelfile`` for a GGUF model: FROM, ADAPTER, a TEMPLATE from the model's own chat template, stops.

Ollama does not run Jinja, so the Hugging Face chat template is rendered on sentinel messages and cut at them: what
comes before the first user message (with and without a system prompt), and what joins a user message to the
assistant's answer and an answer to the next user message. Those pieces, as Go string literals, make a Go template
that renders the same text for a system prompt and alternating user and assistant turns.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.services.local.common import LocalToolError, finished_file

_SYSTEM, _USER, _ANSWER, _NEXT = "RENTUNESYSTEM7F3A", "RENTUNEUSER7F3A", "RENTUNEANSWER7F3A", "RENTUNENEXT7F3A"


@dataclass(frozen=True)
class ChatPieces:
    """The chat template cut at its messages.

    Attributes:
        head_system: Text before the system prompt.
        system_to_user: Text between the system prompt and the first user message.
        head_user: Text before the first user message when there is no system prompt (a default system prompt the
            template adds stays in it).
        user_to_answer: Text between a user message and the assistant's answer (the generation prompt).
        answer_to_user: Text between an answer and the next user message (it starts with the end-of-turn token).
    """

    head_system: str
    system_to_user: str
    head_user: str
    user_to_answer: str
    answer_to_user: str


def _render(tokenizer: Any, system: bool) -> str:
    messages = [
        {"role": "user", "content": _USER},
        {"role": "assistant", "content": _ANSWER},
        {"role": "user", "content": _NEXT},
    ]
    if system:
        messages.insert(0, {"role": "system", "content": _SYSTEM})
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def _cut(text: str, markers: list[str]) -> list[str]:
    """``text`` split at each marker in turn: the pieces before, between and after them."""
    pieces = []
    for marker in markers:
        before, found, text = text.partition(marker)
        if not found:
            raise ValueError(marker)
        pieces.append(before)
    return [*pieces, text]


def chat_pieces(tokenizer: Any) -> ChatPieces:
    """Cuts ``tokenizer``'s chat template at sentinel messages.

    Raises:
        LocalToolError: The tokenizer has no chat template, or it does not render system, user and assistant turns
            as prefix + content + suffix (so no Go template can reproduce it).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise LocalToolError("the model has no chat template, so Ollama's TEMPLATE cannot be written; add one")
    try:
        head_s, s_to_u, u_to_a, a_to_u, generation = _cut(_render(tokenizer, True), [_SYSTEM, _USER, _ANSWER, _NEXT])
        head_u, *rest = _cut(_render(tokenizer, False), [_USER, _ANSWER, _NEXT])
    except ValueError as exc:
        raise LocalToolError(f"the chat template drops a message ({exc}); Ollama's TEMPLATE cannot follow it") from None
    if generation != u_to_a or rest != [u_to_a, a_to_u, generation]:
        raise LocalToolError("the chat template renders turns differently by position; write Ollama's TEMPLATE by hand")
    bos = getattr(tokenizer, "bos_token", None)
    if bos and _adds_bos(tokenizer):
        # llama.cpp adds BOS itself when it tokenises; keeping it in the template would double it.
        head_s, head_u = head_s.removeprefix(bos), head_u.removeprefix(bos)
    return ChatPieces(head_s, s_to_u, head_u, u_to_a, a_to_u)


def _adds_bos(tokenizer: Any) -> bool:
    ids = tokenizer("x")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def _literal(text: str) -> str:
    """``text`` as a Go template action printing it (a JSON string is a valid Go string literal)."""
    return "{{ " + json.dumps(text, ensure_ascii=False) + " }}" if text else ""


def go_template(pieces: ChatPieces) -> str:
    """A Go template (Ollama's ``TEMPLATE``) rendering the same text as the chat template, from ``pieces``."""
    return (
        "{{- if .System }}"
        f"{_literal(pieces.head_system)}{{{{ .System }}}}{_literal(pieces.system_to_user)}"
        f"{{{{- else }}}}{_literal(pieces.head_user)}{{{{- end }}}}\n"
        "{{- range .Messages }}\n"
        f'{{{{- if eq .Role "user" }}}}{{{{ .Content }}}}{_literal(pieces.user_to_answer)}\n'
        f'{{{{- else if eq .Role "assistant" }}}}{{{{ .Content }}}}{_literal(pieces.answer_to_user)}\n'
        "{{- end }}\n"
        "{{- end }}"
    )


def stop_tokens(tokenizer: Any, pieces: ChatPieces) -> list[str]:
    """The end-of-turn token (the first special token after an answer) and the end-of-sequence token."""
    special = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    special |= {str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", 0)}
    found = [(pieces.answer_to_user.find(t), t) for t in special if t and t in pieces.answer_to_user]
    stops = [min(found)[1]] if found else []
    eos = getattr(tokenizer, "eos_token", None)
    return list(dict.fromkeys([*stops, *([str(eos)] if eos else [])]))


def _reference(path: Path, beside: Path) -> str:
    return f"./{path.name}" if path.parent.resolve() == beside.parent.resolve() else str(path.resolve())


def modelfile_text(tokenizer: Any, gguf_file: Path, out_file: Path, adapter_gguf: Path | None = None) -> str:
    """The Modelfile's text for ``gguf_file`` with ``tokenizer``'s chat template (see :func:`write_modelfile`)."""
    pieces = chat_pieces(tokenizer)
    template = go_template(pieces)
    if '"""' in template:
        raise LocalToolError('the chat template contains """, which a Modelfile cannot quote; write it by hand')
    lines = [f"FROM {_reference(gguf_file, out_file)}"]
    if adapter_gguf is not None:
        lines.append(f"ADAPTER {_reference(adapter_gguf, out_file)}")
    lines.append(f'TEMPLATE """{template}"""')
    lines += [f"PARAMETER stop {json.dumps(stop, ensure_ascii=False)}" for stop in stop_tokens(tokenizer, pieces)]
    return "\n".join(lines) + "\n"


def _write(gguf_file: Path, tokenizer_dir: Path, out_file: Path, adapter_gguf: Path | None) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError) as exc:
        raise LocalToolError(
            f"cannot load the tokenizer in {tokenizer_dir} ({exc}); point to the model folder"
        ) from None
    text = modelfile_text(tokenizer, gguf_file, out_file, adapter_gguf)
    with finished_file(out_file) as work:
        work.write_text(text, encoding="utf-8")


async def write_modelfile(
    gguf_file: Path, tokenizer_dir: Path, out_file: Path, *, adapter_gguf: Path | None = None
) -> Path:
    """Writes an Ollama Modelfile for ``gguf_file`` (``ollama create NAME -f out_file``).

    Args:
        gguf_file: The model's GGUF file (referred to as ``./NAME`` when it sits beside ``out_file``).
        tokenizer_dir: A folder with the model's tokenizer and chat template (the merged or base model folder).
        out_file: The Modelfile to write.
        adapter_gguf: A GGUF LoRA to apply on top (``ADAPTER``), if any.

    Returns:
        ``out_file``.

    Raises:
        LocalToolError: The tokenizer cannot be loaded, or its chat template cannot be expressed for Ollama.
    """
    await asyncio.to_thread(_write, gguf_file, tokenizer_dir, out_file, adapter_gguf)
    return out_file
