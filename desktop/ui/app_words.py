"""The app's one wording layer: a service's message as a sentence with the fix in the app's terms.

Services word their failures for the terminal as well: they name a command to run (``rentune keys set runpod``), an
environment variable, a ``SPEC.toml`` key (``[compute] ready_timeout_minutes``) or pass on a provider's raw answer.
In the app the fix is a page, a field or a button, so :func:`app_sentence` rewrites those parts and keeps the rest;
the raw text stays in the log and under a message's Details (:func:`app_message`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A spec key as the app names it: where the user changes it in the wizard.
_SPEC_KEYS: list[tuple[str, str]] = [
    (r"\[budget\] max_usd", "the budget (Compute step)"),
    (r"\[budget\] hourly_rate_usd", "your server's hourly rate (Compute step)"),
    (r"\[data\] (?:train|eval)", "the dataset (Data step)"),
    (r"\[model\] base", "the base model (Model step)"),
    (r"\[training\] \w+", "the training settings (Model step)"),
    (r"\[target\] \w+", "your server (Compute step)"),
    (r"\[compute\] (?:gpu|provider|offer|count|spot|max_price_per_hour)", "the machine picked (Compute step)"),
    (r"\[compute\] (?:python|user|image)", "the machine settings (Compute step)"),
]
#: Fixes that exist only outside the app, as (pattern, replacement): dropped or said as the app's way.
_TERMINAL_FIXES: list[tuple[str, str]] = [
    (r",? or raise \[compute\] ready_timeout_minutes", ""),
    (r"[;,]?\s*\(or set [A-Z_]+\)", ""),
    (r",? or set HF_TOKEN\b", ""),
    (r"\brun rentune keys set (\w+)", r"store its key in Settings"),
    (r"\brentune keys set (\w+)", r"Settings, API keys"),
    (r"\(?\brentune (?:resume|pull) \S+\)?", "Resume on the run's page"),
    (r"\(?\brentune (?:machines|orphans)[^);]*\)?", "the Costs page"),
    (r"\(?see rentune runs\)?", ""),
    (r"\bset (?:RUNPOD|VAST|LAMBDA)_API_KEY\b", "store the key in Settings"),
    (r"\bpass --target ssh://\S+", "choose your server on the Compute step"),
    (r"--(?:gguf|lora-gguf|merge|mlx|base|out)\b", "the export settings"),
]
#: A provider's raw answer: a JSON body, or GraphQL's own words.
_RAW_BODY = re.compile(r":?\s*\{.*\}\s*$|\s*\[\{.*\}\]\s*$", re.DOTALL)
_GRAPHQL = re.compile(r"GraphQL answered (\d{3})", re.IGNORECASE)
_ANY_SPEC_KEY = re.compile(r"\[(\w+)\] \w+")


@dataclass(frozen=True)
class AppMessage:
    """A message for a page: the sentence to show, and the service's own text for Details ("" when the same).

    Attributes:
        text: The sentence, in the app's terms.
        details: The original text, when it said more or otherwise.
    """

    text: str
    details: str


def app_message(raw: str) -> AppMessage:
    """``raw`` as the app shows it, and the raw text kept for Details when the sentence left something out."""
    text = app_sentence(raw)
    return AppMessage(text, "" if text == sentence(raw) else raw.strip())


def app_sentence(raw: str) -> str:
    """A service's message in the app's terms: no command, variable, spec key or raw API body; a capital and a stop."""
    text = _RAW_BODY.sub("", raw.strip()) or raw.strip()
    text = _GRAPHQL.sub(r"the provider refused the request (\1)", text)
    for pattern, replacement in _TERMINAL_FIXES:
        text = re.sub(pattern, replacement, text)
    for pattern, replacement in _SPEC_KEYS:
        text = re.sub(pattern, replacement, text)
    text = _ANY_SPEC_KEY.sub("the run's settings", text)
    text = re.sub(r"\s+([;,.])", r"\1", re.sub(r"  +", " ", text)).strip(" ;,")
    return sentence(text)


#: Names that keep their lower-case first letter at the start of a sentence.
_LOWER_CASE_NAMES = ("llama.cpp", "mlx-lm", "mlx_lm", "llama-cpp-python")


def sentence(text: str) -> str:
    """``text`` as sentences: a capital after each full stop (names like llama.cpp kept) and a stop at the end."""
    text = text.strip()
    if not text:
        return text
    parts = re.split(r"(?<=[.!?])\s+", text)
    capital = [part if part.startswith(_LOWER_CASE_NAMES) else part[:1].upper() + part[1:] for part in parts]
    text = " ".join(capital)
    return text if text.endswith((".", "!", "?")) else text + "."
