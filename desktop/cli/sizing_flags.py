"""The sizing flags ``rentune plan`` and ``rentune offers`` share: the training setup and the workload they describe."""

from __future__ import annotations

import argparse

from desktop.cli.errors import CliError, about
from desktop.core.sizing.plan import Workload
from desktop.core.sizing.setup import Method, Objective, SetupError, Strategy, Targets, TrainingSetup
from trainer_payload.protocol import precomputes_reference

#: The flag of each training setting (a suggestion or an error names it so).
FLAGS = {
    "method": "--method",
    "lora_r": "--lora-r",
    "lora_dropout": "--lora-dropout",
    "seq_len": "--seq-len",
    "micro_batch": "--micro-batch",
    "grad_accum": "--grad-accum",
    "num_gpus": "--gpus",
    "strategy": "--strategy",
}


def training_setup(args: argparse.Namespace, num_gpus: int = 1, strategy: str = "ddp") -> TrainingSetup:
    """The setup the flags describe, on ``num_gpus`` GPUs.

    Raises:
        CliError: A setting is out of range; the message names its flag.
    """
    try:
        return TrainingSetup(
            method=Method(args.method),
            lora_r=args.lora_r,
            targets=Targets(args.targets),
            seq_len=args.seq_len,
            micro_batch=args.micro_batch,
            grad_accum=args.grad_accum,
            grad_ckpt=not args.no_grad_ckpt,
            num_gpus=num_gpus,
            strategy=Strategy(strategy),
            objective=Objective(args.objective),
            reference_precomputed=precomputes_reference(args.objective, args.method, 0),  # a plan trains every epoch
        )
    except SetupError as exc:
        raise CliError(f"{FLAGS.get(exc.setting, exc.setting)} {exc.value!r} {exc.problem}") from exc


def workload(args: argparse.Namespace, seq_len: int) -> tuple[Workload, str]:
    """The training tokens the flags describe (``--tokens`` or a ``--dataset`` counted), and where they came from.

    Raises:
        CliError: Out of range, or the dataset is unusable.
    """
    if not 0 < args.epochs <= 100:
        raise CliError(f"--epochs {args.epochs:g} is out of range: use a number above 0 and at most 100")
    if args.dataset is not None:
        # Only a plan from a dataset reads one: `rentune plan` alone stays a quick command.
        from desktop.core.data.formats import DataFormat
        from desktop.services.data.check import check_dataset
        from desktop.services.data.tokens import load_token_counter

        outcome = check_dataset(args.dataset, seq_len=seq_len, counter=load_token_counter(args.model))
        report = outcome.report
        if report.fatal or report.tokens is None:
            raise CliError(f"{about(args.dataset, report.fatal)}; run rentune data check {args.dataset}")
        kept = outcome.kept_lengths()
        sides = 2 if outcome.fmt is DataFormat.PAIRS else 1  # both answers of a pair, each padded to the longer
        packed = outcome.fmt is DataFormat.TEXT  # raw text runs on into the next sequence: nothing is cut
        trained = sides * sum(n if packed else min(n, seq_len) for n in kept.values())
        source = f"{len(kept):,} usable examples in {args.dataset.name} (duplicates and rows with errors left out), "
        return Workload(tokens=max(1, trained), epochs=args.epochs), source + report.tokens.method
    tokens = 15_000_000 if args.tokens is None else args.tokens
    if not 1_000 <= tokens <= 10**13:
        raise CliError(f"--tokens {tokens:,} is out of range: use a number from 1,000 to 10^13")
    return Workload(tokens=tokens, epochs=args.epochs), "default" if args.tokens is None else "given"
