"""The ``rentune`` command: starts the desktop app, or drives the same services headless.

Without a subcommand it opens the GUI. Subcommands work without a display and never import Qt.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

from desktop import __version__
from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.core.sizing.plan import GPU_COUNTS, Suggestion, Workload, make_plan
from desktop.core.sizing.report import plan_dict, plan_text
from desktop.core.sizing.setup import DEFAULT_SETUP, Method, SetupError, Strategy, Targets, TrainingSetup
from trainer_payload.protocol import PROTOCOL_VERSION

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A problem the user can fix; printed as one line.

    Attributes:
        exit_code: 2 for bad input (the default), 1 when the command ran but could not do its job (an unreachable
            machine, a run that could not be stopped).
    """

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: the problem, and where the options are listed."""

    def error(self, message: str) -> NoReturn:
        """Prints ``PROG: error: MESSAGE; see PROG --help`` and exits with 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def _size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d{3,5})x(\d{3,5})", text)
    if not match:
        raise argparse.ArgumentTypeError(f"size {text!r} must look like 1280x800")
    return int(match[1]), int(match[2])


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"scale {text!r} must be a number such as 1 or 2") from None
    if not 0.5 <= value <= 4:
        raise argparse.ArgumentTypeError(f"scale {value:g} must be between 0.5 and 4")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Returns the parser of the ``rentune`` command line."""
    parser: argparse.ArgumentParser = _Parser(
        prog="rentune",
        description="Fine-tune LLMs on rented GPUs. Without a command, opens the desktop app.",
    )
    parser.add_argument(
        "--version", action="version", version=f"rentune {__version__} (payload protocol {PROTOCOL_VERSION})"
    )
    parser.add_argument("--screenshot", metavar="FILE", type=Path, help="render the window offscreen to a PNG, exit")
    parser.add_argument("--page", metavar="NAME", help="the page to open (or to render with --screenshot)")
    parser.add_argument("--size", type=_size, default=(1280, 800), help="window size, e.g. 1280x800")
    parser.add_argument("--scale", type=_scale, default=1.0, help="UI scale factor, e.g. 2 for 200%%")
    parser.add_argument("--startup-probe", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("gui", help="open the desktop app (the default)")
    doctor = commands.add_parser("doctor", help="check this computer: Python, keyring, data folder, local tools")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    _add_plan_parser(commands)
    _add_data_parser(commands)
    _add_run_parsers(commands)
    return parser


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="ssh://user@host:port (overrides [target] ssh)")
    parser.add_argument("--identity", type=Path, help="private key to log in with (overrides [target] identity)")
    parser.add_argument("--python", help="interpreter on the machine (overrides [target] python)")


def _add_run_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser("run", help="train SPEC.toml on an SSH machine and bring the adapter home")
    run.add_argument("spec", type=Path, help="the run spec (see resources/examples/SPEC.toml)")
    _add_target_options(run)
    run.add_argument("--detach", action="store_true", help="keep driving the run in the background and return")
    runs = commands.add_parser("runs", help="list runs")
    runs.add_argument("--json", action="store_true")
    for name, text in (
        ("status", "show a run's state, history and last events"),
        ("logs", "print a run's events"),
        ("stop", "save a checkpoint, stop training, cancel the run"),
        ("pull", "bring the newest checkpoint home now"),
        ("resume", "continue a run (reattach, or move it to another machine with --target)"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("run_id", metavar="RUN", help="run id (a unique prefix is enough)")
        if name == "logs":
            command.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
            command.add_argument("--payload", action="store_true", help="the trainer's own log from the machine")
        if name == "status":
            command.add_argument("--json", action="store_true")
        if name == "resume":
            _add_target_options(command)


def _columns(text: str) -> dict[str, str]:
    mapping = {}
    for part in text.split(","):
        role, _, column = part.partition("=")
        if role.strip() not in {"system", "user", "assistant"} or not column.strip():
            raise argparse.ArgumentTypeError(
                f"--columns {text!r}: use ROLE=COLUMN pairs, e.g. user=question,"
                "assistant=answer (roles: system, user, assistant)"
            )
        mapping[role.strip()] = column.strip()
    if not {"user", "assistant"} <= set(mapping):
        raise argparse.ArgumentTypeError("--columns needs at least user=COLUMN and assistant=COLUMN")
    return mapping


def _add_data_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    data = commands.add_parser("data", help="check and prepare a chat dataset on this computer")
    actions = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    for name, text in (
        ("check", "report problems with line numbers, and token counts (exit 0 clean, 1 errors, 2 unusable)"),
        ("prepare", "drop bad rows and duplicates, split train/eval, write messages JSONL + manifest"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("file", type=Path, help="JSONL, CSV or Parquet file")
        action.add_argument("--model", help="count tokens with this model's tokenizer and chat template")
        action.add_argument(
            "--seq-len",
            type=int,
            default=DEFAULT_SETUP.seq_len,
            help=f"training sequence length (default {DEFAULT_SETUP.seq_len})",
        )
        action.add_argument("--columns", type=_columns, help="map table columns to roles: user=COL,assistant=COL")
        if name == "check":
            action.add_argument("--json", action="store_true", help="print the report as JSON")
        else:
            action.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, eval.jsonl, manifest")
            action.add_argument("--eval-fraction", type=float, default=0.05, help="share held out (default 0.05)")
            action.add_argument("--seed", type=int, default=42, help="split seed (default 42)")


def _add_plan_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = commands.add_parser(
        "plan",
        help="size a fine-tune: memory per GPU, GPU options, hours and dollars",
        description="Size a fine-tune before renting. Defaults follow proven settings: QLoRA, r=16, alpha=32, all "
        "linear layers, seq 2048, micro-batch 2, grad-accum 4, checkpointing on, 3 epochs.",
    )
    plan.add_argument("--model", help="catalog name, Hub id (org/name), model folder or config.json")
    plan.add_argument("--list-models", action="store_true", help="list the bundled model catalog and exit")
    plan.add_argument("--method", choices=[m.value for m in Method], default=Method.QLORA.value)
    plan.add_argument("--seq-len", type=int, default=DEFAULT_SETUP.seq_len)
    plan.add_argument("--micro-batch", type=int, default=DEFAULT_SETUP.micro_batch)
    plan.add_argument("--grad-accum", type=int, default=DEFAULT_SETUP.grad_accum)
    plan.add_argument("--lora-r", type=int, default=DEFAULT_SETUP.lora_r)
    plan.add_argument("--targets", choices=[Targets.ALL_LINEAR.value, Targets.ATTENTION.value], default="all-linear")
    plan.add_argument("--no-grad-ckpt", action="store_true", help="turn gradient checkpointing off")
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--tokens", type=int, help="training tokens per epoch (default 15,000,000)")
    source.add_argument("--dataset", type=Path, help="JSONL chat dataset to count tokens from")
    plan.add_argument("--epochs", type=float, default=3.0)
    plan.add_argument("--gpu", help="only this GPU type (e.g. h100-sxm, 'RTX 4090')")
    plan.add_argument("--gpus", type=int, help="only this many GPUs")
    plan.add_argument("--strategy", choices=[s.value for s in Strategy], help="multi-GPU strategy")
    plan.add_argument("--json", action="store_true", help="print the plan as one JSON object")


def _run_gui(args: argparse.Namespace) -> int:
    from desktop.ui.app import GuiOptions, GuiStartError, run_gui  # Qt loads only when the GUI is wanted.

    options = GuiOptions(
        screenshot=args.screenshot,
        page=args.page,
        size=args.size,
        scale=args.scale,
        startup_probe=args.startup_probe,
    )
    try:
        return run_gui(options)
    except GuiStartError as exc:
        raise CliError(str(exc)) from exc


def _run_doctor(args: argparse.Namespace) -> int:
    import asyncio

    from desktop.services.environment import check_environment
    from desktop.services.run_engine import run_key_checks

    checks = check_environment() + asyncio.run(run_key_checks())  # run keys still on machines, after a cleanup
    if args.json:
        print(json.dumps([asdict(check) for check in checks], indent=2))
    else:
        for check in checks:
            mark = "ok " if check.ok else ("ERR" if check.required else "-- ")
            fix = f"  -> {check.fix}" if check.fix else ""
            print(f"[{mark}] {check.name:<18} {check.detail}{fix}")
    return EXIT_OK if all(check.ok for check in checks if check.required) else EXIT_FAILED


def _plan_setup(args: argparse.Namespace) -> TrainingSetup:
    try:
        return TrainingSetup(
            method=Method(args.method),
            lora_r=args.lora_r,
            targets=Targets(args.targets),
            seq_len=args.seq_len,
            micro_batch=args.micro_batch,
            grad_accum=args.grad_accum,
            grad_ckpt=not args.no_grad_ckpt,
            num_gpus=1 if args.gpus is None else args.gpus,
            strategy=Strategy(args.strategy or "ddp"),
        )
    except SetupError as exc:
        raise CliError(f"{_FLAGS.get(exc.setting, exc.setting)} {exc.value!r} {exc.problem}") from exc


# The flag of each training setting on `rentune plan` (a suggestion or an error names it so).
_FLAGS = {
    "method": "--method",
    "lora_r": "--lora-r",
    "lora_dropout": "--lora-dropout",
    "seq_len": "--seq-len",
    "micro_batch": "--micro-batch",
    "grad_accum": "--grad-accum",
    "num_gpus": "--gpus",
    "strategy": "--strategy",
}


def suggestion_flags(suggestion: Suggestion) -> str:
    """A suggestion as the flags to rerun ``rentune plan`` with, and why: ``use --seq-len 1024 (shorter ...)``."""
    flags = [
        f"{_FLAGS[c.setting]} {c.after.value if isinstance(c.after, Enum) else c.after}"
        for c in suggestion.changes
        if c.setting in _FLAGS
    ]
    words = ["use " + " ".join(flags)] if flags else []
    if any(change.setting == "grad_ckpt" for change in suggestion.changes):
        words.append("drop --no-grad-ckpt")
    whys = "; ".join(dict.fromkeys(change.why for change in suggestion.changes))
    return f"{' and '.join(words)} ({whys})"


def _about(path: Path, problem: str) -> str:
    """``problem``, led by the file's path unless the sentence already names the file."""
    return problem if path.name in problem else f"{path}: {problem}"


def _plan_workload(args: argparse.Namespace, seq_len: int) -> tuple[Workload, str]:
    if not 0 < args.epochs <= 100:
        raise CliError(f"--epochs {args.epochs:g} is out of range: use a number above 0 and at most 100")
    if args.dataset is not None:
        from desktop.services.data_check import check_dataset
        from desktop.services.token_counting import load_token_counter

        outcome = check_dataset(args.dataset, seq_len=seq_len, counter=load_token_counter(args.model))
        report = outcome.report
        if report.fatal or report.tokens is None:
            raise CliError(f"{_about(args.dataset, report.fatal)}; run rentune data check {args.dataset}")
        kept = outcome.kept_lengths()
        trained = sum(min(n, seq_len) for n in kept.values())
        source = f"{len(kept):,} usable examples in {args.dataset.name} (duplicates and rows with errors left out), "
        return Workload(tokens=max(1, trained), epochs=args.epochs), source + report.tokens.method
    tokens = 15_000_000 if args.tokens is None else args.tokens
    if not 1_000 <= tokens <= 10**13:
        raise CliError(f"--tokens {tokens:,} is out of range: use a number from 1,000 to 10^13")
    return Workload(tokens=tokens, epochs=args.epochs), "default" if args.tokens is None else "given"


def _plan_gpus(args: argparse.Namespace) -> list[GpuSpec]:
    from desktop.services.model_configs import load_gpus

    gpus = list(load_gpus())
    if args.gpu is None:
        return gpus
    found = find_gpu(gpus, args.gpu)
    if found is None:
        raise CliError(f"unknown GPU {args.gpu!r}; choose one of: {', '.join(g.id for g in gpus)}")
    return [found]


def _print_catalog() -> int:
    from desktop.services.model_configs import load_catalog

    for entry in load_catalog():
        arch = entry.arch
        print(f"{entry.id:<46}{arch.total_params / 1e9:>7.2f} B  ctx {arch.max_context:>7,}  {entry.license}")
    return EXIT_OK


def _run_plan(args: argparse.Namespace) -> int:
    from desktop.services.model_configs import ModelResolutionError, resolve_model

    if args.list_models:
        return _print_catalog()
    if not args.model:
        raise CliError("--model is required (a catalog name such as qwen2.5-7b, a Hub id, or a model folder)")
    setup = _plan_setup(args)
    workload, source = _plan_workload(args, setup.seq_len)
    gpus = _plan_gpus(args)
    try:
        arch = resolve_model(args.model)
    except (ModelResolutionError, ArchitectureError) as exc:
        raise CliError(str(exc)) from exc
    counts = GPU_COUNTS if args.gpus is None else (args.gpus,)
    strategy = Strategy(args.strategy) if args.strategy else None
    plan = make_plan(arch, setup, gpus, workload, counts=counts, strategy=strategy)
    if args.json:
        print(json.dumps(plan_dict(plan, source), indent=2))
    else:
        if arch.max_context and setup.seq_len > arch.max_context:
            print(f"warning: --seq-len {setup.seq_len} exceeds the model's context of {arch.max_context}")
        print(plan_text(plan, source, suggestion_flags))
    return EXIT_OK


def _runs_cli() -> Any:
    from desktop.cli_runs import RunsCommands

    return RunsCommands(CliError)


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


def _run_data(args: argparse.Namespace) -> int:
    from desktop.core.data.report import report_text
    from desktop.services.data_check import check_dataset
    from desktop.services.data_prepare import PrepareError, prepare_dataset
    from desktop.services.token_counting import load_token_counter

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
            raise CliError(_about(args.file, report.fatal))
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
    print(
        f"Wrote {counts['train']:,} training and {counts['eval']:,} eval examples to {args.out} "
        f"({counts['with_errors']:,} rows with errors and {counts['duplicates_removed']:,} duplicates left out)"
    )
    return EXIT_OK


_COMMANDS: dict[str | None, Callable[[argparse.Namespace], int]] = {
    "data": _run_data,
    "run": lambda args: _runs_cli().run(args),
    "runs": lambda args: _runs_cli().list(args),
    "status": lambda args: _runs_cli().status(args),
    "logs": lambda args: _runs_cli().logs(args),
    "stop": lambda args: _runs_cli().stop(args),
    "pull": lambda args: _runs_cli().pull(args),
    "resume": lambda args: _runs_cli().resume(args),
    None: _run_gui,
    "gui": _run_gui,
    "doctor": _run_doctor,
    "plan": _run_plan,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``rentune`` command line.

    Args:
        argv: The arguments (without the program name); ``sys.argv[1:]`` by default.

    Returns:
        The exit code: 0 success, 1 the command ran and found problems, 2 bad input.
    """
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except CliError as exc:
        print(f"rentune: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rentune: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last guard: one line here, the traceback goes to the log
        return _unexpected(exc)


def _unexpected(exc: Exception) -> int:
    """Prints one line for an error no command foresaw and logs its traceback for a bug report."""
    from desktop.services.logs import configure_logging, get_logger

    try:
        where = f" (details in {configure_logging()})"
    except OSError:  # no writable log folder: the one line is all there is
        where = ""
    else:
        get_logger("cli").error("unexpected error", exc_info=exc)
    print(f"rentune: error: unexpected {type(exc).__name__}: {exc}; please report it{where}", file=sys.stderr)
    return EXIT_FAILED
