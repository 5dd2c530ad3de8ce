"""``rentune trial SPEC``: a short run on a slice of the data on this computer, before anything is rented.

It prints each step as it trains, then what the trial proved: the loss (falling or not), this computer's tokens per
second and peak memory, the adapter's first answers to held-out chats beside the data's, and the run it is listed
under. ``--json`` prints one object instead: ``plan`` (``backend``, ``rows``, ``steps``) and the result's fields
(``loss_start``, ``loss_end``, ``loss_falls``, ``tokens_per_s``, ``peak_memory_gb``, ``seconds``, ``answers``,
``losses``, ``run_id``, ``adapter``). Exit 1 when the trial cannot run here or its loss did not fall.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from desktop.core.runs.progress import format_duration
from desktop.core.runs.spec import RunSpec, RunSpecError
from desktop.core.runs.trial import TrialBackend, TrialPlan, TrialResult, TrialStep
from desktop.core.sizing.architecture import ArchitectureError
from desktop.services.local.common import LocalToolError
from desktop.services.local.toolenv import local_python
from desktop.services.models.configs import ModelResolutionError, hub_config_fetcher
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.spec_file import read_run_spec
from desktop.services.runs.store import RunStore
from desktop.services.trial.errors import TrialError
from desktop.services.trial.prepare import plan_here
from desktop.services.trial.runner import TrialWatch, run_trial


def run_trial_command(args: argparse.Namespace) -> int:
    """``rentune trial``: plans the trial, runs it, prints what it proved."""
    if args.steps < 1:
        raise CliError("--steps must be at least 1", EXIT_USAGE)
    try:
        spec = read_run_spec(args.spec)
    except RunSpecError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    plan = _plan(spec, args)
    if plan.backend is None:
        raise CliError(plan.reason, EXIT_FAILED)
    watch = TrialWatch(None, None) if args.json else TrialWatch(_print_step(plan), _print_phase)
    try:
        python = str(local_python())
        result = asyncio.run(run_trial(spec, plan, python=python, store=RunStore(), watch=watch, secrets=SecretStore()))
    except (TrialError, LocalToolError) as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print(json.dumps({"plan": _plan_json(plan), **result.as_dict()}, indent=2))
    else:
        print("\n".join(result_lines(result)))
    if not result.loss_falls:
        raise CliError(
            "the loss did not fall on the slice: check the chat template and the labels (rentune data check) "
            "before renting, or try more --steps",
            EXIT_FAILED,
        )
    return EXIT_OK


def _plan(spec: RunSpec, args: argparse.Namespace) -> TrialPlan:
    try:
        backend = TrialBackend(args.on) if args.on else None
        fetch = hub_config_fetcher(SecretStore())
        return plan_here(spec, steps=args.steps, share=args.slice, backend=backend, fetch=fetch)
    except TrialError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except (ModelResolutionError, ArchitectureError) as exc:
        raise CliError(f"the trial cannot size {spec.base_model}: {exc}", EXIT_FAILED) from exc


def _plan_json(plan: TrialPlan) -> dict[str, object]:
    return {"backend": plan.backend.value if plan.backend else None, "rows": plan.rows, "steps": plan.steps}


def _print_phase(words: str) -> None:
    print(words[:1].upper() + words[1:] + "…", flush=True)


def _print_step(plan: TrialPlan) -> Callable[[TrialStep], None]:
    def show(step: TrialStep) -> None:
        speed = f"  {step.tokens_per_s:,.0f} tokens/s" if step.tokens_per_s else ""
        print(f"step {step.step}/{plan.steps}  loss {step.loss:.4f}{speed}", flush=True)

    return show


def gb(value: float) -> str:
    """Gigabytes with the decimals a small number needs: ``0.04 GB``, ``12.3 GB``."""
    return f"{value:.2f} GB" if value < 1 else f"{value:.1f} GB"


def result_lines(result: TrialResult) -> list[str]:
    """What the trial proved, in lines: the loss, speed and memory, the first answers, where the adapter is."""
    start, end = result.loss_start, result.loss_end
    verdict = "falls: the template and labels train" if result.loss_falls else "does NOT fall"
    speed = f"{result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else "speed not measured"
    peak = f"peak memory {gb(result.peak_memory_gb)}" if result.peak_memory_gb else "peak memory not measured"
    lines = [
        "",
        f"trial: {len(result.steps)} steps with {result.backend.label} in {format_duration(result.seconds)}",
        f"loss {start:.3f} -> {end:.3f}: {verdict}" if start is not None and end is not None else "no loss reported",
        f"{speed}; {peak}",
    ]
    if result.answers:
        lines += ["", "first answers to chats it did not train on:"]
        for answer in result.answers:
            lines += [f"  asked:    {answer.prompt}", f"  data:     {answer.expected}"]
            lines += [f"  adapter:  {answer.answer or '(an empty answer)'}", ""]
    lines.append(
        f"adapter: run {result.run_id} ({result.adapter}); the Models page lists it: export it to chat with it "
        f"(rentune export {result.run_id} --gguf Q4_K_M)"
    )
    return lines
