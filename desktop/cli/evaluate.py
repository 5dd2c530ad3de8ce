"""``rentune eval`` (also ``rentune compare``): base vs fine-tuned on held-out chats, judged.

Both models answer each held-out row; task checks chosen from the reference answers score both (with ``--regex`` and
``--json-schema`` as the user's own checks); the verdict names the rows that flipped and how clear the difference is.
The report (Markdown, HTML and JSON) adds each model's loss, and for a run id the run's loss curve and cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from desktop.services.evaluation.judge import Judgement, JudgeOptions, check_options, judge_and_report
from desktop.services.evaluation.report import report_json, summary_lines
from desktop.services.local.common import LocalInputError, LocalToolError
from desktop.services.runs.outputs import AdapterSource, AdapterSourceError, resolve_adapter
from desktop.services.runs.run_facts import run_facts_of


def run_eval(args: argparse.Namespace) -> int:
    """``rentune eval ADAPTER_DIR_OR_RUN_ID [--base] [--eval FILE] [--regex RE] [--json-schema FILE] [--general]``."""
    try:
        source = resolve_adapter(args.adapter)
    except AdapterSourceError as exc:
        raise CliError(str(exc)) from exc
    eval_file = _eval_file(args.eval, source)
    options = JudgeOptions(
        args.regex, args.json_schema, _positive(args.max_examples, "--max-examples"), general=args.general
    )
    out: Path = args.out or source.default_out("eval")
    try:
        check_options(options)  # a bad regex or schema is said before any model loads
        judgement, written = asyncio.run(_judge(args.base or source.base, source, eval_file, out, options))
    except LocalToolError as exc:
        raise CliError(str(exc), EXIT_USAGE if isinstance(exc, LocalInputError) else EXIT_FAILED) from exc
    _print_result(judgement, written, as_json=args.json)
    return EXIT_OK


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise CliError(f"{flag} {value} is not a row count: give 1 or more")
    return value


async def _judge(
    base: str | None, source: AdapterSource, eval_file: Path, out: Path, options: JudgeOptions
) -> tuple[Judgement, dict[str, Path]]:
    run = await run_facts_of(None, source.run_id)
    return await judge_and_report(
        base, source.adapter, eval_file, out, options=options, run=run, progress=_show_progress
    )


def _eval_file(given: Path | None, source: AdapterSource) -> Path:
    path = given or source.eval_file
    if path is None:
        raise CliError("no held-out chat file to judge on; pass --eval FILE (chat JSONL)")
    if not path.is_file():
        raise CliError(f"eval file {path} does not exist; pass --eval FILE (chat JSONL)")
    return path


def _show_progress(text: str, fraction: float | None) -> None:
    shown = "" if fraction is None else f" ({fraction:.0%})"
    print(f"eval: {text}{shown}", file=sys.stderr, flush=True)


def _print_result(judgement: Judgement, written: dict[str, Path], *, as_json: bool) -> None:
    if as_json:
        report = {**report_json(judgement), "report": {kind: str(path) for kind, path in written.items()}}
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    for line in summary_lines(judgement):
        print(line)
    print(f"Report: {written['markdown']} (and report.html, report.json beside it)")
