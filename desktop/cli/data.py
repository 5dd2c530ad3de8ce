"""``rentune data check|prepare``: check a chat dataset on this computer, and prepare it for upload."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from desktop.cli.errors import EXIT_OK, CliError, about
from desktop.core.data.report import report_text
from desktop.services.data.check import check_dataset
from desktop.services.data.prepare import PrepareError, prepare_dataset
from desktop.services.data.tokens import load_token_counter


def _data_progress() -> Callable[[int, int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        print(
            f"\rreading {done / 1e6:,.0f} / {total / 1e6:,.0f} MB",
            end="" if done < total else "\n",
            file=sys.stderr,
            flush=True,
        )

    return show


def run_data(args: argparse.Namespace) -> int:
    """``rentune data check FILE`` (exit 0 clean, 1 errors) or ``rentune data prepare FILE --out DIR``."""
    if not 16 <= args.seq_len <= 1_048_576:
        raise CliError(f"--seq-len {args.seq_len} is out of range: use a whole number from 16 to 1,048,576")
    counter = load_token_counter(args.model)
    if args.data_command == "check":
        report = check_dataset(
            args.file, seq_len=args.seq_len, counter=counter, columns=args.columns, progress=_data_progress()
        ).report
        if args.json or report.summaries or not report.fatal:  # a file unusable as a whole has nothing to list
            print(json.dumps(report.to_dict(), indent=2) if args.json else report_text(report))
        if report.fatal:
            raise CliError(about(args.file, report.fatal))
        return int(report.verdict)
    try:
        prepared = prepare_dataset(
            args.file,
            args.out,
            seq_len=args.seq_len,
            eval_fraction=args.eval_fraction,
            seed=args.seed,
            counter=counter,
            columns=args.columns,
            progress=_data_progress(),
        )
    except PrepareError as exc:
        raise CliError(str(exc)) from exc
    counts = prepared.manifest_data["counts"]
    print(report_text(prepared.report))
    units = {"text": "paragraphs or documents", "pairs": "pairs"}
    unit = units.get(str(prepared.manifest_data.get("format", "")), "examples")
    print(
        f"Wrote {counts['train']:,} training and {counts['eval']:,} eval {unit} to {args.out} "
        f"({counts['with_errors']:,} rows with errors and {counts['duplicates_removed']:,} duplicates left out)"
    )
    return EXIT_OK
