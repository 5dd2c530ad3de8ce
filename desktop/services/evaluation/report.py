"""The evaluation report: the verdict, the scores, the rows that flipped, the losses and the run's cost.

Markdown for any viewer, HTML for a browser (with the loss curves drawn as SVG), JSON for programs. Text from the data
or the models is never interpreted: in Markdown it sits in fenced blocks whose fence is longer than any run of
backticks inside it, in HTML it is escaped inside ``<pre>``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desktop.core.judging.checks import CHECK_WORDS
from desktop.core.judging.verdict import CheckScore, Outcome, RowScore, Verdict
from desktop.core.runs.progress import format_duration
from desktop.services.evaluation.general import general_json, general_lines, table_rows
from desktop.services.evaluation.preference import ANSWERS_HEADING, preference_json, preference_lines
from desktop.services.local.common import finished_file

if TYPE_CHECKING:
    from desktop.services.evaluation.judge import Judgement
    from desktop.services.evaluation.run_facts import RunFacts

#: The report's files, by format.
REPORT_FILES = {"markdown": "report.md", "html": "report.html", "json": "report.json"}


def write_reports(judgement: Judgement, out: Path) -> dict[str, Path]:
    """Writes ``report.md``, ``report.html`` and ``report.json`` into ``out``, each appearing only when complete."""
    texts = {
        "markdown": markdown_report(judgement),
        "html": html_report(judgement),
        "json": json.dumps(report_json(judgement), indent=2, ensure_ascii=False) + "\n",
    }
    written = {}
    for kind, name in REPORT_FILES.items():
        with finished_file(out / name) as work:
            work.write_text(texts[kind], encoding="utf-8")
        written[kind] = out / name
    return written


def _score(right: int, rows: int) -> str:
    return f"{right}/{rows} ({right / rows:.0%})" if rows else "—"


def score_line(score: CheckScore) -> str:
    """``Normalised match: base 2/10 (20%), tuned 9/10 (90%)``."""
    words = CHECK_WORDS[score.kind]
    return f"{words[:1].upper()}{words[1:]}: base {_score(score.base_right, score.rows)}, " + (
        f"tuned {_score(score.tuned_right, score.rows)}"
    )


def verdict_words(verdict: Verdict) -> str:
    """The verdict in words: clear, leaning one way (too few flipped rows to be sure), or no difference."""
    return outcome_words(verdict.outcome, len(verdict.fixed), len(verdict.broke))


def outcome_words(outcome: Outcome, fixed: int, broke: int) -> str:
    """An outcome and its flips in words (what :func:`verdict_words` says, from a saved report too)."""
    if outcome is Outcome.BETTER:
        return "The fine-tune is better at the task"
    if outcome is Outcome.WORSE:
        return "The fine-tune is worse at the task"
    if fixed == broke:
        return "No difference on the task"
    leaning = "better" if fixed > broke else "worse"
    return f"Leaning {leaning}, not yet clear (more held-out rows would tell)"


def summary_lines(judgement: Judgement) -> list[str]:
    """The verdict and its facts, one per line (plain text)."""
    verdict, result = judgement.verdict, judgement.comparison
    lines = preference_lines(judgement.preference) if judgement.preference is not None else []
    if judgement.preference is not None:
        lines.append(ANSWERS_HEADING)
    lines += [
        f"{verdict_words(verdict)}: {len(verdict.fixed)} row(s) fixed, {len(verdict.broke)} broken "
        f"(p = {verdict.p_value:.3g}, exact McNemar test on the rows that flipped).",
        *(score_line(score) for score in verdict.scores),
        f"Mean loss on the reference answers (lower is better): base {result.base_loss:.4f}, "
        f"tuned {result.tuned_loss:.4f}.",
        f"Rows judged: {len(result.examples)} of {result.usable_rows} usable rows"
        + (f", answered on {result.judged_on}." if result.judged_on else "."),
    ]
    if result.cut:
        lines.append(f"The evaluation was cut to the first {len(result.examples)} rows to keep it short.")
    if judgement.run is not None:
        lines.append(_run_line(judgement.run))
    if judgement.general is not None:
        lines += general_lines(judgement.general)
    return lines


def _run_line(run: RunFacts) -> str:
    cost = f"${run.usd:,.2f}" if run.usd is not None else "no cost recorded"
    where = f" on {run.gpu}" if run.gpu else ""
    return f"Run {run.run_id}: {run.method or 'fine-tune'} of {run.base_model}{where}, trained for " + (
        f"{format_duration(run.trained_seconds)}, {cost}."
    )


def report_json(judgement: Judgement) -> dict[str, Any]:
    """The report as JSON: verdict, scores, flips, losses, every row, and the run."""
    verdict, result, run = judgement.verdict, judgement.comparison, judgement.run
    return {
        "outcome": verdict.outcome.value,
        "p_value": verdict.p_value,
        "deciding_check": verdict.deciding.value,
        "scores": [
            {"check": s.kind.value, "base_right": s.base_right, "tuned_right": s.tuned_right, "rows": s.rows}
            for s in verdict.scores
        ],
        "labels": [vars(label) for label in verdict.labels],
        "fixed": [_row_json(row) for row in verdict.fixed],
        "broke": [_row_json(row) for row in verdict.broke],
        "base_loss": result.base_loss,
        "tuned_loss": result.tuned_loss,
        "rows": [_row_json(row) for row in judgement.rows],
        "usable_rows": result.usable_rows,
        "base": str(result.base),
        "adapter": str(result.adapter),
        "eval_file": str(result.eval_file),
        "judged_on": result.judged_on or "this computer",
        "run": None if run is None else {**vars(run), "losses": run.losses, "eval_losses": run.eval_losses},
        "general": None if judgement.general is None else general_json(judgement.general),
        "preference": None if judgement.preference is None else preference_json(judgement.preference),
    }


def _row_json(row: RowScore) -> dict[str, Any]:
    return {
        "line": row.line,
        "prompt": row.prompt,
        "reference": row.reference,
        "base_answer": row.base_answer,
        "tuned_answer": row.tuned_answer,
        "base": {kind.value: ok for kind, ok in row.base.items()},
        "tuned": {kind.value: ok for kind, ok in row.tuned.items()},
    }


# -- Markdown --------------------------------------------------------------------------------------------------------


def _fence(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _inline_code(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    return f"{ticks} {text} {ticks}"


def _mark(ok: bool) -> str:
    return "right" if ok else "wrong"


def markdown_report(judgement: Judgement) -> str:
    """The report as Markdown."""
    result, verdict = judgement.comparison, judgement.verdict
    lines = ["# Base vs fine-tuned", ""]
    lines += [f"- Base model: {_inline_code(str(result.base))}", f"- Adapter: {_inline_code(str(result.adapter))}"]
    lines += [f"- Eval file: {_inline_code(str(result.eval_file))}", ""]
    lines += [f"- {line}" for line in summary_lines(judgement)] + [""]
    lines += ["| Check | Base | Fine-tuned |", "|---|---|---|"]
    lines += [
        f"| {CHECK_WORDS[s.kind]} | {_score(s.base_right, s.rows)} | {_score(s.tuned_right, s.rows)} |"
        for s in verdict.scores
    ]
    lines += [f"| Mean loss (lower is better) | {result.base_loss:.4f} | {result.tuned_loss:.4f} |", ""]
    if judgement.general is not None:
        lines += [f"## General ability ({judgement.general.harness})", ""]
        lines += ["| Task | Base | Fine-tuned | Difference, points (95% interval) | |", "|---|---|---|---|---|"]
        lines += [f"| {' | '.join(cells)} |" for cells in table_rows(judgement.general)] + [""]
    if verdict.labels:
        lines += ["## Per label", "", "| Label | Rows | Base right | Fine-tuned right |", "|---|---|---|---|"]
        lines += [f"| {_inline_code(x.label)} | {x.rows} | {x.base_right} | {x.tuned_right} |" for x in verdict.labels]
        lines.append("")
    for title, rows in (("Fixed by the fine-tune", verdict.fixed), ("Broken by the fine-tune", verdict.broke)):
        lines += [f"## {title} ({len(rows)})", ""]
        for row in rows:
            lines += _markdown_row(row, judgement.verdict.deciding)
    lines += ["## Every row", ""]
    for row in judgement.rows:
        lines += _markdown_row(row, judgement.verdict.deciding)
    return "\n".join(lines)


def _markdown_row(row: RowScore, deciding: Any) -> list[str]:
    return [
        f"### Line {row.line}: base {_mark(row.base[deciding])}, fine-tuned {_mark(row.tuned[deciding])}",
        "",
        "**Prompt**",
        "",
        _fence(row.prompt),
        "",
        "**Reference**",
        "",
        _fence(row.reference),
        "",
        "**Base answer**",
        "",
        _fence(row.base_answer),
        "",
        "**Fine-tuned answer**",
        "",
        _fence(row.tuned_answer),
        "",
    ]


# -- HTML ------------------------------------------------------------------------------------------------------------

_STYLE = (
    "body{font-family:sans-serif;max-width:62em;margin:auto;padding:1em}"
    "pre{white-space:pre-wrap;background:#f4f4f4;padding:.5em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
    ".right{color:#0a7a32}.wrong{color:#b3261e}"
)


def html_report(judgement: Judgement) -> str:
    """The report as one self-contained HTML page."""
    esc = html.escape
    result, verdict = judgement.comparison, judgement.verdict
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Base vs fine-tuned</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Base vs fine-tuned</h1><ul>",
        f"<li>Base model: <code>{esc(str(result.base))}</code></li>",
        f"<li>Adapter: <code>{esc(str(result.adapter))}</code></li>",
        f"<li>Eval file: <code>{esc(str(result.eval_file))}</code></li></ul>",
        *(f"<p>{esc(line)}</p>" for line in summary_lines(judgement)),
        "<table><tr><th>Check</th><th>Base</th><th>Fine-tuned</th></tr>",
        *(
            f"<tr><td>{esc(CHECK_WORDS[s.kind])}</td><td>{_score(s.base_right, s.rows)}</td>"
            f"<td>{_score(s.tuned_right, s.rows)}</td></tr>"
            for s in verdict.scores
        ),
        f"<tr><td>Mean loss (lower is better)</td><td>{result.base_loss:.4f}</td><td>{result.tuned_loss:.4f}</td>"
        "</tr></table>",
    ]
    if verdict.labels:
        parts.append("<h2>Per label</h2><table><tr><th>Label</th><th>Rows</th><th>Base right</th>")
        parts.append("<th>Fine-tuned right</th></tr>")
        parts += [
            f"<tr><td><code>{esc(x.label)}</code></td><td>{x.rows}</td><td>{x.base_right}</td>"
            f"<td>{x.tuned_right}</td></tr>"
            for x in verdict.labels
        ]
        parts.append("</table>")
    if judgement.general is not None:
        parts.append(f"<h2>General ability ({esc(judgement.general.harness)})</h2><table><tr><th>Task</th>")
        parts.append("<th>Base</th><th>Fine-tuned</th><th>Difference, points (95% interval)</th><th></th></tr>")
        parts += [
            "<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in cells) + "</tr>"
            for cells in table_rows(judgement.general)
        ]
        parts.append("</table>")
    if judgement.run is not None and judgement.run.losses:
        parts += ["<h2>Loss during training</h2>", loss_svg(judgement.run)]
    for title, rows in (("Fixed by the fine-tune", verdict.fixed), ("Broken by the fine-tune", verdict.broke)):
        parts.append(f"<h2>{title} ({len(rows)})</h2>")
        parts += [_html_row(row, verdict.deciding) for row in rows]
    parts.append("<h2>Every row</h2>")
    parts += [_html_row(row, verdict.deciding) for row in judgement.rows]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _html_row(row: RowScore, deciding: Any) -> str:
    esc = html.escape
    base, tuned = _mark(row.base[deciding]), _mark(row.tuned[deciding])
    return (
        f'<h3>Line {row.line}: base <span class="{base}">{base}</span>, '
        f'fine-tuned <span class="{tuned}">{tuned}</span></h3>'
        f"<h4>Prompt</h4><pre>{esc(row.prompt)}</pre><h4>Reference</h4><pre>{esc(row.reference)}</pre>"
        f"<h4>Base answer</h4><pre>{esc(row.base_answer)}</pre>"
        f"<h4>Fine-tuned answer</h4><pre>{esc(row.tuned_answer)}</pre>"
    )


def loss_svg(run: RunFacts, width: int = 640, height: int = 240) -> str:
    """The training loss (and the held-out loss, when measured) against the step, as an inline SVG."""
    curves = [(run.losses, "#3b5bdb", "training"), (run.eval_losses, "#e8590c", "held-out")]
    points = [point for curve, _colour, _name in curves for point in curve]
    low_step, high_step = min(p[0] for p in points), max(p[0] for p in points)
    low, high = min(p[1] for p in points), max(p[1] for p in points)
    pad = 32

    def xy(step: int, loss: float) -> str:
        x = pad + (step - low_step) / max(1, high_step - low_step) * (width - 2 * pad)
        y = pad + (high - loss) / max(1e-9, high - low) * (height - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="Loss by step: training, and held-out where measured">',
        f'<text x="{pad}" y="16" font-size="12">loss {high:.3g} (top) to {low:.3g} (bottom); step {low_step} to '
        f"{high_step}</text>",
    ]
    for curve, colour, name in curves:
        if curve:
            path = " ".join(xy(step, loss) for step, loss in curve)
            lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"><title>{name}')
            lines.append("</title></polyline>")
    lines.append("</svg>")
    return "".join(lines)
