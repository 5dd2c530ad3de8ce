"""Counting tokens of conversations: with a model's real tokenizer and chat template, or a labelled estimate.

Only tokenizer files are fetched (never weights): from a local model folder, or from the Hugging Face Hub into the
app's cache. Without transformers, offline, or for a model whose tokenizer cannot be had, the estimate is used and
says so.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretName, SecretStore, SecretStoreError

Conversation = list[dict[str, Any]]
TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "config.json",
]
CHARS_PER_TOKEN = 4.0
TEMPLATE_TOKENS_PER_MESSAGE = 4

_log = get_logger("tokens")
_LOADING = threading.Lock()


class TokenCounter(Protocol):
    """Counts the tokens each conversation becomes through the chat template.

    Attributes:
        description: How tokens are counted, in one phrase (the CLI prints it).
        exact: True when the model's own tokenizer counts; False for the estimate.
        model: The model whose tokenizer counts, or was wanted when the estimate stands in ("" for none).
        reason: Why the estimate is used ("" when exact).
    """

    description: str
    exact: bool
    model: str
    reason: str

    def count(self, conversations: Sequence[Conversation]) -> list[int]:
        """Returns one token count per conversation."""
        ...

    def count_text(self, texts: Sequence[str]) -> list[int]:
        """Returns one token count per raw text document (with the end-of-text token packing puts after it)."""
        ...


class EstimatedTokenCounter:
    """About four characters per token plus a few template tokens per message (no tokenizer needed)."""

    exact = False

    def __init__(self, reason: str = "no model given", model: str = "") -> None:
        self.reason = reason
        self.model = model  # the model whose tokenizer was wanted, if any
        self.description = f"estimate, ~4 characters per token ({reason})"

    def count(self, conversations: Sequence[Conversation]) -> list[int]:
        """Estimates each conversation's length."""
        return [
            round(sum(len(m.get("content") or "") for m in c) / CHARS_PER_TOKEN) + TEMPLATE_TOKENS_PER_MESSAGE * len(c)
            for c in conversations
        ]

    def count_text(self, texts: Sequence[str]) -> list[int]:
        """Estimates each document's length (and its end-of-text token)."""
        return [round(len(text) / CHARS_PER_TOKEN) + 1 for text in texts]


class ChatTemplateTokenCounter:
    """Exact counts: the model's chat template rendered for a batch, then the fast tokenizer's batch encode."""

    exact = True
    reason = ""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tokenizer = tokenizer
        self.model = name
        self.description = f"tokenizer and chat template of {name}"

    def count(self, conversations: Sequence[Conversation]) -> list[int]:
        """Counts exactly what training will see."""
        texts = self._tokenizer.apply_chat_template(list(conversations), tokenize=False)
        encoded = self._tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def count_text(self, texts: Sequence[str]) -> list[int]:
        """Counts each document as packing tokenises it: its tokens and the end-of-text token after it."""
        encoded = self._tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)
        return [len(ids) + 1 for ids in encoded["input_ids"]]


def _tokenizer_folder(model: str) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    from desktop.services.models.configs import load_catalog

    entry = load_catalog().entry(model)
    repo_id = entry.id if entry else model
    try:
        token = SecretStore().get(SecretName.HUGGINGFACE)
    except SecretStoreError:
        token = None
    cache = app_paths().cache_dir / "hub"
    return Path(snapshot_download(repo_id, allow_patterns=TOKENIZER_FILES, cache_dir=str(cache), token=token))


def load_token_counter(model: str | None) -> TokenCounter:
    """Returns an exact counter for ``model`` when its tokenizer can be loaded, else the labelled estimate.

    Loads are one at a time: transformers' lazy imports are not safe to race, and two checks (the Data step's and
    the Sizing step's recount) may ask at once.
    """
    if not model:
        return EstimatedTokenCounter()
    with _LOADING:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            return EstimatedTokenCounter("the transformers library is not installed", model)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(_tokenizer_folder(model)))
        except Exception as exc:  # noqa: BLE001 - Hub, file and tokenizer errors all mean "fall back to the estimate"
            _log.info("tokenizer of %s unavailable: %s", model, exc)
            reason = f"the tokenizer of {model} could not be loaded: {_why_not_loaded(exc)}"
            return EstimatedTokenCounter(reason, model)
    if not getattr(tokenizer, "chat_template", None):
        return EstimatedTokenCounter(f"{model} has no chat template", model)
    return ChatTemplateTokenCounter(tokenizer, model)


def _why_not_loaded(exc: Exception) -> str:
    """A tokenizer failure in words a user can act on (not an exception class name)."""
    name = type(exc).__name__
    if name in {"LocalEntryNotFoundError", "ConnectError", "ConnectionError", "OfflineModeIsEnabled"}:
        return "it is not downloaded yet and the Hugging Face Hub cannot be reached; check the network"
    if name in {"GatedRepoError", "RepositoryNotFoundError"}:
        return "the model is gated or private: accept its licence on huggingface.co and add an HF token in Settings"
    if name == "HFValidationError":
        return "the name is neither a Hugging Face model id, written org/name, nor a model folder on this computer"
    if isinstance(exc, OSError):
        return "its tokenizer files are missing or unreadable; the log has the details"
    return "its tokenizer files could not be read; the log has the details"
