"""How the wizard words a dataset check: a summary (badge, headline, details), a file's problem, and the token count.

The data services return data (a :class:`DatasetCheck` with its :class:`DataNumbers`, a problem kind); the CLI words
them as a terminal report, the wizard's pages here. The Review can use the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.data.findings import Code
from desktop.core.data.formats import DataFormat
from desktop.core.model_names import model_name
from desktop.services.data.numbers import DataNumbers
from desktop.services.data.reader import TEXT_SUFFIXES, FileProblem
from desktop.services.data.workspace import DatasetCheck

FORMAT_LABELS = {
    DataFormat.MESSAGES.value: "chat messages",
    DataFormat.ALPACA.value: "Alpaca: instruction, input and output",
    DataFormat.SHAREGPT.value: "ShareGPT conversations",
    DataFormat.PROMPT_COMPLETION.value: "prompt and completion",
    DataFormat.COLUMNS.value: "table columns mapped to roles",
    DataFormat.PAIRS.value: "preference pairs: a prompt, a chosen and a rejected answer",
    DataFormat.TEXT.value: "raw text: paragraphs or documents to continue pre-training on",
}

#: The fix the wizard gives for some kinds of findings, in its own words (others use the check's).
FIX_WORDS = {
    Code.NOT_UTF8.value: "Re-save the file as UTF-8: most editors offer it under Save as or Encoding.",
    Code.TOO_LONG.value: (
        "Raise the sequence length under Advanced settings on the Model step (more memory), or shorten or split "
        "these examples; the excess is cut."
    ),
    Code.SECRET.value: (
        "Tick “Leave out rows with suspected secrets” above, or remove the secrets from the file: a model can learn "
        "and repeat them."
    ),
}


#: What a warning counts, per kind (singular, plural): each finding of a kind is one row.
WARNING_NOUNS = {
    Code.DUPLICATE.value: ("repeated row left out", "repeated rows left out"),
    Code.NEAR_DUPLICATE.value: ("nearly repeated row left out", "nearly repeated rows left out"),
    Code.TOO_LONG.value: ("row too long", "rows too long"),
    Code.SECRET.value: ("row with a suspected secret", "rows with a suspected secret"),
    Code.EMAIL.value: ("row with an e-mail address", "rows with an e-mail address"),
}
#: Kinds of warning the Ready badge names; the others are counted, and all are in its tooltip.
BADGE_KINDS = 2


#: What a file of pairs or of raw text trains with, said on the Data step (the Model step offers the choice).
NEXT_WORDS = {
    DataFormat.PAIRS.value: (
        "Preference pairs train with DPO (or ORPO): the model learns to prefer the chosen answer over the rejected "
        "one. The Model step lets you choose."
    ),
    DataFormat.TEXT.value: (
        "Raw text trains with continued pre-training: the model learns the language of your domain, not to chat. "
        "The held-out text measures its perplexity before and after."
    ),
}


@dataclass(frozen=True)
class DataSummary:
    """The outcome of a check as the Data step shows it.

    Attributes:
        severity: ``success``, ``warning`` or ``danger`` (the badge's colour).
        badge: The badge's words.
        headline: One line on the outcome.
        details: The lines under it.
        badge_tip: The badge's tooltip: every kind of warning it counts ("" when it says it all).
    """

    severity: str
    badge: str
    headline: str
    details: list[str]
    badge_tip: str = ""


def counted(count: int, noun: str, plural: str = "") -> str:
    """``1 row``, ``3 rows`` (``plural`` for irregular nouns)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def model_words(model: str) -> str:
    """A model as people read it: a Hub id as it is, a local folder by its name (a cache snapshot by its Hub id)."""
    return model_name(model, mark_local=False)


def counting_words(numbers: DataNumbers) -> str:
    """How the tokens were counted: the model's tokenizer, or the estimate and why."""
    if numbers.exact:
        return f"Counted with the tokenizer of {model_words(numbers.model)}."
    if not numbers.model:
        return (
            "Estimated at about 4 characters per token, as no model is chosen yet: the count becomes exact once "
            "you choose a model on the next step."
        )
    reason = numbers.estimate_reason.removeprefix(f"the tokenizer of {numbers.model} could not be loaded: ")
    return (
        f"Estimated at about 4 characters per token: the tokenizer of {model_words(numbers.model)} could not be "
        f"loaded, as {reason.rstrip('.')}."
    )


#: What is said after the count of training examples, per layout that is not chats.
_AFTER_COUNT = {
    DataFormat.PAIRS.value: " (each pair's prompt is read with either answer)",
    DataFormat.TEXT.value: " (packed into full sequences: a long document runs on into the next, nothing is cut)",
}


def _examples(count: int, data_format: str, *, held: bool = False) -> str:
    """``12 training pairs``, ``1 more example``, ``30 paragraphs or documents``: what a layout's rows are."""
    if data_format == DataFormat.TEXT.value:
        return f"{count:,} more" if held else counted(count, "paragraph or document", "paragraphs or documents")
    noun = "pair" if data_format == DataFormat.PAIRS.value else "example"
    return counted(count, f"{'more' if held else 'training'} {noun}")


def tokens_words(numbers: DataNumbers, *, data_format: str = "") -> str:
    """Tokens per epoch and the examples (preference pairs, paragraphs of raw text) they come from."""
    examples = _examples(numbers.train_examples, data_format)
    text = f"{numbers.train_tokens:,} tokens trained per epoch, from {examples}{_AFTER_COUNT.get(data_format, '')}"
    if numbers.eval_examples:
        text += f"; {_examples(numbers.eval_examples, data_format, held=True)} held out to evaluate the model"
    return text + "."


def left_out_words(numbers: DataNumbers) -> str:
    """What the prepared data leaves out, or "" when it keeps every row."""
    parts = []
    if numbers.rows_with_errors:
        parts.append(counted(numbers.rows_with_errors, "row") + " with errors")
    if numbers.duplicates_removed:
        parts.append(counted(numbers.duplicates_removed, "repeated row"))
    if numbers.secrets_left_out and numbers.secret_rows:
        parts.append(counted(numbers.secret_rows, "row") + " with a suspected secret")
    return f"Left out: {', '.join(parts)}." if parts else ""


def truncation_words(numbers: DataNumbers) -> str:
    """How many examples the sequence length cuts, or "" when none."""
    if not numbers.too_long:
        return ""
    return (
        f"{counted(numbers.too_long, 'example')} {'is' if numbers.too_long == 1 else 'are'} longer than the "
        f"sequence length of {numbers.seq_len:,} tokens: {numbers.cut_tokens:,} tokens are cut."
    )


def warning_words(findings: list[dict[str, Any]]) -> list[str]:
    """Each kind of warning by what it counts, most rows first: ``40 repeated rows left out``, ``1 row too long``."""
    warnings = [f for f in findings if f.get("severity") == "warning" and int(f.get("count", 0))]
    warnings.sort(key=lambda f: -int(f["count"]))
    words = []
    for finding in warnings:
        one, many = WARNING_NOUNS.get(str(finding["code"]), ("row with a warning", "rows with a warning"))
        words.append(counted(int(finding["count"]), one, many))
    return words


def _badge(numbers: DataNumbers, findings: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(severity, badge words, tooltip): a ready file names what its warnings count, two kinds at most."""
    if numbers.rows_with_errors:
        return "warning", f"Usable · {counted(numbers.rows_with_errors, 'row')} left out", ""
    if numbers.secret_rows and not numbers.secrets_left_out:
        return "warning", f"Usable · {counted(numbers.secret_rows, 'suspected secret')}", ""
    kinds = warning_words(findings)
    if not kinds:
        return "success", "Ready", ""
    shown = ", ".join(kinds[:BADGE_KINDS])
    more = len(kinds) - BADGE_KINDS
    badge = f"Ready · {shown}" + (f" and {counted(more, 'more kind')}" if more > 0 else "")
    return "success", badge, f"Warnings, listed under Findings: {', '.join(kinds)}."


def summary(check: DatasetCheck) -> DataSummary:
    """The summary of a check: usable or not, what is kept and left out, the tokens and how they were counted."""
    name = Path(check.source).name
    numbers = check.numbers
    if check.fatal or numbers is None or not check.usable:
        headline, details = file_problem(check)
        return DataSummary("danger", "Cannot be used", headline, [details])
    severity, badge, tip = _badge(numbers, list(check.report.get("findings") or []))
    lines = [f"Layout: {FORMAT_LABELS.get(check.data_format, 'unknown')}."]
    lines += [line for line in (left_out_words(numbers), _problems_line(numbers)) if line]
    lines += [tokens_words(numbers, data_format=check.data_format), counting_words(numbers)]
    lines += [line for line in (truncation_words(numbers),) if line]
    lines += [_sentence(f"Note: {note}") for note in check.report.get("notes") or []]
    lines += [NEXT_WORDS[check.data_format]] if check.data_format in NEXT_WORDS else []
    rows = (
        counted(numbers.rows, "paragraph")
        if check.data_format == DataFormat.TEXT.value
        else counted(numbers.rows, "row")
    )
    headline = f"{name}: {numbers.kept:,} of {rows} will be used"
    return DataSummary(severity, badge, headline, lines, tip)


def _row_noun(check: DatasetCheck) -> str:
    """What a row of the file is: a paragraph of a text file, a document of a JSONL of raw text, else a row."""
    if check.data_format != DataFormat.TEXT.value:
        return "row"
    return "paragraph" if Path(check.source).suffix.lower() in TEXT_SUFFIXES else "document"


def _problems_line(numbers: DataNumbers) -> str:
    """How many errors the rows left out hold: rows and errors are different counts (a row may have several)."""
    if numbers.error_problems <= numbers.rows_with_errors:
        return ""  # one error per row: the rows left out say it all
    rows = "The row holds" if numbers.rows_with_errors == 1 else f"Those {numbers.rows_with_errors:,} rows hold"
    return f"{rows} {counted(numbers.error_problems, 'error')} in all, listed under Findings with their lines."


def file_problem(check: DatasetCheck) -> tuple[str, str]:
    """Why a checked file cannot be used, as (headline, what to do)."""
    name = Path(check.source).name
    kind = check.fatal_kind
    words = {
        FileProblem.MISSING.value: (f"{name} does not exist", "Check the path, or choose the file with Choose file…."),
        FileProblem.FOLDER.value: (f"{name} is a folder", "Choose a JSONL, CSV, Parquet or .txt file inside it."),
        FileProblem.UNKNOWN_TYPE.value: (
            f"{name} is not a dataset file Rentune reads",
            "Use a .jsonl, .csv or .parquet file of conversations.",
        ),
        FileProblem.PRETTY_JSON.value: (
            f"{name} is one JSON document, not JSON Lines",
            "Save it with one conversation object per line, then check it again.",
        ),
        FileProblem.NOT_TEXT.value: (f"{name} is not UTF-8 text", "Re-save it as UTF-8, then check it again."),
        FileProblem.NEEDS_PYARROW.value: (
            "Parquet files need the pyarrow library",
            "Install the local tools (Models page), or export the data as JSONL or CSV.",
        ),
        FileProblem.UNKNOWN_LAYOUT.value: (
            f"Which columns of {name} hold the conversation?",
            "Its rows are not in a chat layout Rentune knows. Choose the column with the user's message and the "
            "one with the answer below.",
        ),
        FileProblem.EMPTY.value: (f"{name} holds no rows", "Choose a file with at least one conversation."),
        FileProblem.NO_USABLE_ROW.value: (
            f"No row of {name} can be used",
            "Every row has an error: fix the rows listed under Findings, then check the file again.",
        ),
    }
    fallback = (f"{name} cannot be used", _sentence(check.fatal or "Nothing could be prepared from it") + "")
    return words.get(kind, fallback)


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "."


def fix_words(finding: dict[str, Any]) -> str:
    """The fix for a finding, in the wizard's words."""
    return FIX_WORDS.get(str(finding["code"]), _sentence(str(finding["fix"])))


def histogram_caption(numbers: DataNumbers | None, data_format: str = "") -> str:
    """Length statistics under the histogram."""
    if numbers is None or not numbers.percentiles:
        return "No example could be measured."
    p = numbers.percentiles
    cut = truncation_words(numbers) or f"None is longer than the sequence length of {numbers.seq_len:,} tokens."
    if data_format == DataFormat.TEXT.value:
        cut = f"Packed into sequences of {numbers.seq_len:,} tokens: nothing is cut."
    return (
        f"Median {p.get('p50', 0):,} tokens, 90 % under {p.get('p90', 0):,}, longest {p.get('max', 0):,}. {cut} "
        f"{counting_words(numbers)}"
    )
