"""``rentune plan``: size a fine-tune (memory per GPU, GPU options, hours, dollars) and word the fixes as flags."""

from __future__ import annotations

import argparse
import json
from enum import Enum

from desktop.cli.errors import EXIT_OK, CliError
from desktop.cli.sizing_flags import FLAGS, training_setup
from desktop.cli.sizing_flags import workload as sizing_workload
from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.calibration import JobKind, Learned
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.core.sizing.plan import GPU_COUNTS, NODE_COUNTS, Suggestion, make_plan
from desktop.core.sizing.report import plan_dict, plan_text
from desktop.core.sizing.setup import Strategy
from desktop.services.models.configs import ModelResolutionError, load_catalog, load_gpus, resolve_model
from desktop.services.platform.paths import app_paths


def suggestion_flags(suggestion: Suggestion) -> str:
    """A suggestion as the flags to rerun ``rentune plan`` with, and why: ``use --seq-len 1024 (shorter ...)``."""
    flags = [
        f"{FLAGS[c.setting]} {c.after.value if isinstance(c.after, Enum) else c.after}"
        for c in suggestion.changes
        if c.setting in FLAGS
    ]
    words = ["use " + " ".join(flags)] if flags else []
    if any(change.setting == "grad_ckpt" for change in suggestion.changes):
        words.append("drop --no-grad-ckpt")
    whys = "; ".join(dict.fromkeys(change.why for change in suggestion.changes))
    return f"{' and '.join(words)} ({whys})"


def _learned(kind: JobKind) -> Learned:
    """What the user's runs measured for this kind of job (just the catalog and the memory model before any run)."""
    if not (app_paths().data_dir / "runs.db").exists():
        return Learned(list(load_gpus()), {})  # nothing to learn from yet: no reason to load the run store
    from desktop.services.runs.estimates import learned_for

    return learned_for(kind)


def _plan_gpus(args: argparse.Namespace, learned: Learned) -> list[GpuSpec]:
    """The GPU types to plan for, with speeds measured on the user's runs applied."""
    if args.gpu is None:
        return learned.gpus
    found = find_gpu(learned.gpus, args.gpu)
    if found is None:
        raise CliError(f"unknown GPU {args.gpu!r}; choose one of: {', '.join(g.id for g in learned.gpus)}")
    return [found]


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
    if not 1 <= args.max_nodes <= NODE_COUNTS[-1]:
        raise CliError(f"--max-nodes {args.max_nodes} is out of range: use a whole number from 1 to {NODE_COUNTS[-1]}")
    setup = training_setup(args, 1 if args.gpus is None else args.gpus, args.strategy or "ddp")
    workload, source = sizing_workload(args, setup.seq_len)
    try:
        arch = resolve_model(args.model)
    except (ModelResolutionError, ArchitectureError) as exc:
        raise CliError(str(exc)) from exc
    learned = _learned(JobKind.of(arch, setup))
    gpus, calibration = _plan_gpus(args, learned), learned.note
    counts = GPU_COUNTS if args.gpus is None else (args.gpus,)
    strategy = Strategy(args.strategy) if args.strategy else None
    plan = make_plan(
        arch,
        setup,
        gpus,
        workload,
        counts=counts,
        strategy=strategy,
        measured=learned.memory or None,
        max_nodes=args.max_nodes,
    )
    if args.json:
        print(json.dumps({**plan_dict(plan, source), "calibration": calibration}, indent=2))
    else:
        if arch.max_context and setup.seq_len > arch.max_context:
            print(f"warning: --seq-len {setup.seq_len} exceeds the model's context of {arch.max_context}")
        print(plan_text(plan, source, suggestion_flags))
        if calibration:
            print(calibration[0].upper() + calibration[1:])
    return EXIT_OK
