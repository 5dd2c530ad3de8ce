"""Aggregating findings and token lengths into a dataset report (kept small however large the file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from desktop.core.data.findings import CODE_INFO, Code, Finding, Severity
from desktop.core.data.formats import FORMAT_NAMES, DataFormat

LINES_KEPT = 20
DETAILS_KEPT = 3
HISTOGRAM_EDGES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class Verdict(IntEnum):
    """Outcome of a check, as the exit code of ``rentune data check``."""

    CLEAN = 0
    ERRORS = 1
    UNUSABLE = 2


@dataclass
class CodeSummary:
    """All findings of one kind: how many, the first lines, and a few details."""

    code: Code
    count: int = 0
    lines: list[int] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        """Counts one more finding, keeping the first lines and details only."""
        self.count += 1
        if len(self.lines) < LINES_KEPT:
            self.lines.append(finding.line)
        if finding.detail and len(self.details) < DETAILS_KEPT:
            self.details.append(f"line {finding.line}: {finding.detail}")


@dataclass(frozen=True)
class TokenStats:
    """Length statistics of the examples, in tokens.

    Attributes:
        method: How tokens were counted (the tokenizer used, or that it is an estimate).
        total: Tokens over all examples before truncation.
        trained: Tokens trained per epoch after truncation to the sequence length.
        cut: Tokens truncation removes.
        too_long: Examples longer than the sequence length.
        percentiles: p50, p90, p99 and max.
        histogram: Count of examples per length bucket (upper edges), last bucket open.
    """

    method: str
    seq_len: int
    total: int
    trained: int
    cut: int
    too_long: int
    mean: float
    percentiles: dict[str, int]
    histogram: list[tuple[str, int]]


def _percentile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


def token_stats(lengths: list[int], seq_len: int, method: str, *, packed: bool = False) -> TokenStats:
    """Summarises example lengths against the sequence length.

    ``packed``: the examples are raw text packed into full sequences (continued pre-training): a document longer
    than the sequence length runs on into the next sequence, so nothing is cut.
    """
    ordered = sorted(lengths) or [0]
    buckets = [0] * (len(HISTOGRAM_EDGES) + 1)
    for length in lengths:
        buckets[next((i for i, edge in enumerate(HISTOGRAM_EDGES) if length <= edge), len(HISTOGRAM_EDGES))] += 1
    labels = [f"<={edge}" for edge in HISTOGRAM_EDGES] + [f">{HISTOGRAM_EDGES[-1]}"]
    return TokenStats(
        method=method,
        seq_len=seq_len,
        total=sum(lengths),
        trained=sum(lengths) if packed else sum(min(n, seq_len) for n in lengths),
        cut=0 if packed else sum(max(0, n - seq_len) for n in lengths),
        too_long=0 if packed else sum(n > seq_len for n in lengths),
        mean=round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
        percentiles={
            "p50": _percentile(ordered, 0.5),
            "p90": _percentile(ordered, 0.9),
            "p99": _percentile(ordered, 0.99),
            "max": ordered[-1],
        },
        histogram=list(zip(labels, buckets, strict=True)),
    )


@dataclass
class DataReport:
    """The result of checking one dataset file.

    Attributes:
        path: The file checked.
        format: The detected format's description ("" when none was found).
        rows: Rows read (lines with content, or table rows).
        valid: Rows without errors.
        summaries: Findings per kind.
        tokens: Length statistics of the valid rows, when counted.
        fatal: Why the file is unusable as a whole ("" when it is usable).
        notes: What holds for the file as a whole and is worth knowing (a preference file's length bias).
    """

    path: str
    format: str = ""
    rows: int = 0
    valid: int = 0
    summaries: dict[Code, CodeSummary] = field(default_factory=dict)
    tokens: TokenStats | None = None
    fatal: str = ""
    notes: list[str] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        """Records one finding."""
        self.summaries.setdefault(finding.code, CodeSummary(finding.code)).add(finding)

    def count(self, code: Code) -> int:
        """How many findings of a kind."""
        summary = self.summaries.get(code)
        return summary.count if summary else 0

    @property
    def errors(self) -> int:
        """Findings of error severity."""
        return sum(s.count for c, s in self.summaries.items() if CODE_INFO[c].severity is Severity.ERROR)

    @property
    def verdict(self) -> Verdict:
        """Clean, errors found, or unusable."""
        if self.fatal or self.valid == 0:
            return Verdict.UNUSABLE
        return Verdict.ERRORS if self.errors else Verdict.CLEAN

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON fields."""
        return {
            "path": self.path,
            "format": self.format,
            "verdict": self.verdict.name.lower(),
            "fatal": self.fatal or None,
            "rows": self.rows,
            "valid_rows": self.valid,
            "notes": self.notes,
            "findings": [
                {
                    "code": code.value,
                    "severity": CODE_INFO[code].severity.value,
                    "title": CODE_INFO[code].title,
                    "count": s.count,
                    "lines": s.lines,
                    "details": s.details,
                    "fix": CODE_INFO[code].fix,
                }
                for code, s in sorted(self.summaries.items(), key=_severity_order)
            ],
            "tokens": None
            if self.tokens is None
            else {
                "method": self.tokens.method,
                "seq_len": self.tokens.seq_len,
                "total": self.tokens.total,
                "trained": self.tokens.trained,
                "cut": self.tokens.cut,
                "too_long": self.tokens.too_long,
                "mean": self.tokens.mean,
                "percentiles": self.tokens.percentiles,
                "histogram": dict(self.tokens.histogram),
            },
        }


def _severity_order(item: tuple[Code, CodeSummary]) -> tuple[int, str]:
    return (0 if CODE_INFO[item[0]].severity is Severity.ERROR else 1, item[0].value)


def report_text(report: DataReport) -> str:
    """The report for a terminal."""
    if report.fatal and not report.summaries:
        return f"{report.path}: unusable: {report.fatal}"
    text = report.format == FORMAT_NAMES[DataFormat.TEXT]
    rows = "paragraphs or documents" if text else "rows"
    lines = [
        f"{report.path}: {report.format or 'format unknown'}; {report.rows:,} {rows}, {report.valid:,} without errors"
    ]
    for code, summary in sorted(report.summaries.items(), key=_severity_order):
        info = CODE_INFO[code]
        shown = ", ".join(map(str, summary.lines[:10])) + (" ..." if summary.count > 10 else "")
        lines.append(f"  {info.severity.value.upper():<8}{summary.count:>7,} x {info.title} (lines {shown})")
        lines += [f"{'':17}{detail}" for detail in summary.details]
        lines.append(f"{'':17}fix: {info.fix}")
    if report.tokens and report.valid:
        t = report.tokens
        p = t.percentiles
        lines += [
            f"Tokens ({t.method}): {t.total:,} in all, {t.trained:,} trained per epoch at seq-len {t.seq_len}; "
            f"mean {t.mean:g}, p50 {p['p50']}, p90 {p['p90']}, p99 {p['p99']}, max {p['max']}",
            f"  packed into sequences of {t.seq_len} tokens: a long document runs on into the next, nothing is cut"
            if text
            else f"  {t.too_long:,} examples longer than {t.seq_len} lose {t.cut:,} tokens to truncation",
            "  " + "  ".join(f"{label}:{n}" for label, n in t.histogram if n),
        ]
    lines += [f"Note: {note}" for note in report.notes]
    verdict = {
        0: "clean",
        1: "errors found: fix them, or prepare the data to drop those rows",
        2: f"unusable: {report.fatal}",
    }[report.verdict]
    lines.append(f"Result: {verdict}")
    return "\n".join(lines)
