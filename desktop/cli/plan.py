"""``rentune plan``: size a fine-tune (memory per GPU, GPU options, hours, dollars) and word the fixes as flags."""

from __future__ import annotations

import argparse
import json
from enum import Enum

from desktop.cli.errors import EXIT_OK, CliError, about
from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.core.sizing.plan import GPU_COUNTS, Suggestion, Workload, make_plan
from desktop.core.sizing.report import plan_dict, plan_text
from desktop.core.sizing.setup import Method, SetupError, Strategy, Targets, TrainingSetup
from desktop.services.models.configs import ModelResolutionError, load_catalog, resolve_model


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


def _plan_workload(args: argparse.Namespace, seq_len: int) -> tuple[Workload, str]:
    if not 0 < args.epochs <= 100:
        raise CliError(f"--epochs {args.epochs:g} is out of range: use a number above 0 and at most 100")
    if args.dataset is not None:
        # Only a plan from a dataset reads one: `rentune plan` alone stays a quick command.
        from desktop.services.data.check import check_dataset
        from desktop.services.data.tokens import load_token_counter

        outcome = check_dataset(args.dataset, seq_len=seq_len, counter=load_token_counter(args.model))
        report = outcome.report
        if report.fatal or report.tokens is None:
            raise CliError(f"{about(args.dataset, report.fatal)}; run rentune data check {args.dataset}")
        kept = outcome.kept_lengths()
        trained = sum(min(n, seq_len) for n in kept.values())
        source = f"{len(kept):,} usable examples in {args.dataset.name} (duplicates and rows with errors left out), "
        return Workload(tokens=max(1, trained), epochs=args.epochs), source + report.tokens.method
    tokens = 15_000_000 if args.tokens is None else args.tokens
    if not 1_000 <= tokens <= 10**13:
        raise CliError(f"--tokens {tokens:,} is out of range: use a number from 1,000 to 10^13")
    return Workload(tokens=tokens, epochs=args.epochs), "default" if args.tokens is None else "given"


def _plan_gpus(args: argparse.Namespace) -> tuple[list[GpuSpec], str | None]:
    """The GPU types to plan for, with speeds measured on the user's finished runs applied (and a note saying so)."""
    from desktop.core.sizing.calibration import calibration_note
    from desktop.services.runs.estimates import calibrated_gpus

    gpus, calibrations = calibrated_gpus()
    note = calibration_note(calibrations, gpus)
    if args.gpu is None:
        return gpus, note
    found = find_gpu(gpus, args.gpu)
    if found is None:
        raise CliError(f"unknown GPU {args.gpu!r}; choose one of: {', '.join(g.id for g in gpus)}")
    return [found], note


def _print_catalog() -> int:
    for entry in load_catalog():
        arch = entry.arch
        print(f"{entry.id:<46}{arch.total_params / 1e9:>7.2f} B  ctx {arch.max_context:>7,}  {entry.license}")
    return EXIT_OK


def run_plan(args: argparse.Namespace) -> int:
    """Prints the plan for ``--model`` (text or ``--json``), or the catalog with ``--list-models``."""
    if args.list_models:
        return _print_catalog()
    if not args.model:
        raise CliError("--model is required (a catalog name such as qwen2.5-7b, a Hub id, or a model folder)")
    setup = _plan_setup(args)
    workload, source = _plan_workload(args, setup.seq_len)
    gpus, calibration = _plan_gpus(args)
    try:
        arch = resolve_model(args.model)
    except (ModelResolutionError, ArchitectureError) as exc:
        raise CliError(str(exc)) from exc
    counts = GPU_COUNTS if args.gpus is None else (args.gpus,)
    strategy = Strategy(args.strategy) if args.strategy else None
    plan = make_plan(arch, setup, gpus, workload, counts=counts, strategy=strategy)
    if args.json:
        print(json.dumps({**plan_dict(plan, source), "calibration": calibration}, indent=2))
    else:
        if arch.max_context and setup.seq_len > arch.max_context:
            print(f"warning: --seq-len {setup.seq_len} exceeds the model's context of {arch.max_context}")
        print(plan_text(plan, source, suggestion_flags))
        if calibration:
            print(calibration[0].upper() + calibration[1:])
    return EXIT_OK
