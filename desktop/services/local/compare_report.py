"""The base-vs-tuned report a user can read and share: Markdown for any viewer, HTML for a browser.

Text from the data or the models is never interpreted: in Markdown it sits in fenced blocks whose fence is longer
than any run of backticks inside it, in HTML it is escaped inside ``<pre>``.
"""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

from desktop.services.local.base_model import local_base
from desktop.services.local.common import Progress, finished_file, no_progress
from desktop.services.local.compare import CompareResult, compare_adapter
from desktop.services.platform.secrets import SecretStore

_FIELDS = (
    ("Prompt", "prompt"),
    ("Reference", "reference"),
    ("Base answer", "base_answer"),
    ("Tuned answer", "tuned_answer"),
)


def write_compare_report(result: CompareResult, out: Path) -> tuple[Path, Path]:
    """Writes ``report.md`` and ``report.html`` into ``out`` (created), each appearing only when complete.

    Returns:
        The Markdown and the HTML file.
    """
    written = []
    for name, text in (("report.md", markdown_report(result)), ("report.html", html_report(result))):
        with finished_file(out / name) as work:
            work.write_text(text, encoding="utf-8")
        written.append(out / name)
    return written[0], written[1]


async def compare_and_report(
    base: str | None,
    adapter: Path,
    eval_file: Path,
    out: Path,
    *,
    max_examples: int = 50,
    max_new_tokens: int = 128,
    progress: Progress = no_progress,
    secrets: SecretStore | None = None,
) -> tuple[CompareResult, Path, Path]:
    """Finds (or downloads) the base, compares it with the adapter on ``eval_file`` and writes the report to ``out``.

    Cancelling the awaiting task stops a download at its next chunk and the comparison before its next example;
    no report is written then.

    Returns:
        The comparison, and the Markdown and HTML reports.

    Raises:
        LocalToolError: The base cannot be found or downloaded, or the comparison failed (see
            :func:`desktop.services.local.compare.compare_adapter`).
    """
    folder = await local_base(base, progress, secrets)
    result = await compare_adapter(
        folder, adapter, eval_file, max_examples=max_examples, max_new_tokens=max_new_tokens, progress=progress
    )
    markdown, page = await asyncio.to_thread(write_compare_report, result, out)
    return result, markdown, page


def summary_lines(result: CompareResult) -> list[str]:
    """The losses and what they mean, one fact per line (plain text)."""
    change = result.tuned_loss - result.base_loss
    verdict = "the fine-tuned model fits the references better" if change < 0 else "the fine-tuning did not help"
    lines = [
        f"Mean loss on the reference answers (lower is better): base {result.base_loss:.4f}, "
        f"tuned {result.tuned_loss:.4f}, difference {change:+.4f} ({verdict})",
        f"Rows compared: {len(result.examples)} of {result.usable_rows} usable rows",
    ]
    if result.cut:
        lines.append(f"The comparison was cut to the first {len(result.examples)} rows to keep it short.")
    return lines


def _fence(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _inline_code(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    return f"{ticks} {text} {ticks}"


def markdown_report(result: CompareResult) -> str:
    """The report as Markdown."""
    lines = ["# Base vs fine-tuned", ""]
    lines += [f"- Base model: {_inline_code(str(result.base))}", f"- Adapter: {_inline_code(str(result.adapter))}"]
    lines += [f"- Eval file: {_inline_code(str(result.eval_file))}", ""]
    lines += [*summary_lines(result), ""]
    lines += ["| | Mean loss |", "|---|---|", f"| Base | {result.base_loss:.4f} |"]
    lines += [f"| Fine-tuned | {result.tuned_loss:.4f} |", ""]
    for number, example in enumerate(result.examples, start=1):
        lines += [f"## Example {number} (line {example.line})", ""]
        for title, field_name in _FIELDS:
            lines += [f"**{title}**", "", _fence(getattr(example, field_name)), ""]
    return "\n".join(lines)


def html_report(result: CompareResult) -> str:
    """The report as one self-contained HTML page."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Base vs fine-tuned</title>',
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}"
        "pre{white-space:pre-wrap;background:#f4f4f4;padding:.5em}</style></head><body>",
        "<h1>Base vs fine-tuned</h1><ul>",
        f"<li>Base model: <code>{esc(str(result.base))}</code></li>",
        f"<li>Adapter: <code>{esc(str(result.adapter))}</code></li>",
        f"<li>Eval file: <code>{esc(str(result.eval_file))}</code></li></ul>",
        *(f"<p>{esc(line)}</p>" for line in summary_lines(result)),
    ]
    for number, example in enumerate(result.examples, start=1):
        parts.append(f"<h2>Example {number} (line {example.line})</h2>")
        for title, field_name in _FIELDS:
            parts.append(f"<h3>{title}</h3><pre>{esc(getattr(example, field_name))}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
