"""``rentune compare``: base vs fine-tuned on held-out chats, answers side by side and each model's mean loss."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from desktop.services.local.base_model import local_base
from desktop.services.local.common import LocalInputError, LocalToolError
from desktop.services.local.compare import CompareResult, compare_adapter
from desktop.services.local.compare_report import summary_lines, write_compare_report
from desktop.services.runs.outputs import AdapterSource, AdapterSourceError, resolve_adapter


def run_compare(args: argparse.Namespace) -> int:
    """``rentune compare ADAPTER_DIR_OR_RUN_ID [--base MODEL] [--eval FILE] [--out DIR] [--json]``."""
    try:
        source = resolve_adapter(args.adapter)
    except AdapterSourceError as exc:
        raise CliError(str(exc)) from exc
    eval_file = _eval_file(args.eval, source)
    out: Path = args.out or source.default_out("compare")
    try:
        result = asyncio.run(_compare(args.base or source.base, source.adapter, eval_file))
        markdown, _html = write_compare_report(result, out)
    except LocalToolError as exc:
        raise CliError(str(exc), EXIT_USAGE if isinstance(exc, LocalInputError) else EXIT_FAILED) from exc
    _print_result(result, markdown, as_json=args.json)
    return EXIT_OK


async def _compare(base: str | None, adapter: Path, eval_file: Path) -> CompareResult:
    folder = await local_base(base, _show_progress)  # a Hub id is downloaded (cached) first
    return await compare_adapter(folder, adapter, eval_file, progress=_show_progress)


def _eval_file(given: Path | None, source: AdapterSource) -> Path:
    path = given or source.eval_file
    if path is None:
        raise CliError("no held-out chat file to compare on; pass --eval FILE (chat JSONL)")
    if not path.is_file():
        raise CliError(f"eval file {path} does not exist; pass --eval FILE (chat JSONL)")
    return path


def _show_progress(text: str, fraction: float | None) -> None:
    shown = "" if fraction is None else f" ({fraction:.0%})"
    print(f"compare: {text}{shown}", file=sys.stderr, flush=True)


def _print_result(result: CompareResult, report: Path, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**result.to_json(), "report": str(report)}, indent=2, ensure_ascii=False))
        return
    for line in summary_lines(result):
        print(line)
    print(f"Report: {report} (and {report.with_suffix('.html').name} beside it)")
