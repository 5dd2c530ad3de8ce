"""``rentune compare``: base vs fine-tuned on held-out chats, answers side by side and each model's mean loss."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from desktop.cli.errors import EXIT_OK, CliError
from desktop.services.local.common import LocalToolError
from desktop.services.local.compare import CompareResult, compare_adapter
from desktop.services.local.compare_report import summary_lines, write_compare_report
from desktop.services.runs.outputs import AdapterSource, AdapterSourceError, resolve_adapter


def run_compare(args: argparse.Namespace) -> int:
    """``rentune compare ADAPTER_DIR_OR_RUN_ID [--base MODEL] [--eval FILE] [--out DIR] [--json]``."""
    try:
        source = resolve_adapter(args.adapter)
    except AdapterSourceError as exc:
        raise CliError(str(exc)) from exc
    base, eval_file = _base_folder(args.base or source.base), _eval_file(args.eval, source)
    out: Path = args.out or Path.cwd() / f"{source.adapter.name}-compare"
    try:
        result = asyncio.run(compare_adapter(base, source.adapter, eval_file, progress=_show_progress))
        markdown, _html = write_compare_report(result, out)
    except LocalToolError as exc:
        raise CliError(str(exc)) from exc
    _print_result(result, markdown, as_json=args.json)
    return EXIT_OK


def _base_folder(base: str | None) -> Path:
    if not base:
        raise CliError("the adapter does not say which base model it was trained on; pass --base FOLDER")
    path = Path(base).expanduser()
    if not (path / "config.json").is_file():
        raise CliError(f"base model {base} is not a model folder on this computer; pass --base FOLDER")
    return path


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
