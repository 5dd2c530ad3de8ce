"""The payload's command line: ``python -m trainer_payload run job.json``, and its other commands.

``bootstrap``, ``export``, ``serve``, and ``fetch``, ``push`` and ``courier`` (data and checkpoints through the
user's bucket).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer_payload import __version__
from trainer_payload.protocol import PROTOCOL_VERSION


def build_parser() -> argparse.ArgumentParser:
    """Returns the payload's argument parser."""
    parser = argparse.ArgumentParser(prog="python -m trainer_payload", description="Rentune's trainer payload.")
    parser.add_argument(
        "--version", action="version", version=f"trainer_payload {__version__} (protocol {PROTOCOL_VERSION})"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="train the job described by a job.json")
    run.add_argument("job", type=Path, help="path of job.json")
    export = commands.add_parser("export", help="after training: the merged model and GGUF files, hashed")
    export.add_argument("job", type=Path, help="path of the trained job's job.json")
    export.add_argument("export_job", type=Path, help="path of the export job (what to make)")
    serve = commands.add_parser("serve", help="after training: serve the model on the machine until idle or stopped")
    serve.add_argument("job", type=Path, help="path of the trained job's job.json")
    serve.add_argument("serve_job", type=Path, help="path of the serve job (name, idle minutes, context)")
    commands.add_parser(
        "fetch", help="download files from presigned URLs into this folder, each verified (the list on stdin)"
    )
    commands.add_parser(
        "push", help="upload a checkpoint's files to presigned multipart URLs, part by part (the plan on stdin)"
    )
    courier = commands.add_parser(
        "courier", help="send each sealed checkpoint to the bucket with the links the app handed out ahead"
    )
    courier.add_argument("--detach", metavar="PIDFILE", help="go on in the background; write its pid to PIDFILE")
    boot = commands.add_parser("bootstrap", help="install what a stock PyTorch image lacks, download the model")
    boot.add_argument("job", type=Path, help="path of job.json (for the model to download and the events file)")
    boot.add_argument("--dry-run", action="store_true", help="report what would be installed, install nothing")
    boot.add_argument(
        "--lock", type=Path, help="hashed lock to install from (default: the payload's requirements-lock.txt)"
    )
    return parser


def _bucket_command(args: argparse.Namespace) -> int:
    """``fetch``, ``push`` or ``courier``: files between the run's folder and the user's bucket, by presigned links."""
    if args.command == "courier":
        from trainer_payload.courier import main as run_courier

        return run_courier(["--detach", args.detach] if args.detach else [])
    if args.command == "fetch":
        from trainer_payload.fetch import run_fetch

        return run_fetch()
    from trainer_payload.push import run_push

    return run_push()


def main(argv: list[str] | None = None) -> int:
    """Parses the command line and runs the chosen command.

    Returns:
        The process exit code.
    """
    args = build_parser().parse_args(argv)
    if args.command == "run":
        from trainer_payload.train import run_job

        return run_job(args.job)
    if args.command == "export":
        from trainer_payload.export import run_export

        return run_export(args.job, args.export_job)
    if args.command in {"fetch", "push", "courier"}:
        return _bucket_command(args)
    if args.command == "serve":
        from trainer_payload.serve import run_serve

        return run_serve(args.job, args.serve_job)
    from trainer_payload.bootstrap import bootstrap, enter_venv, in_venv_of
    from trainer_payload.lock import LOCK

    lock = (args.lock or LOCK).resolve()
    if args.dry_run or in_venv_of(args.job):
        return bootstrap(args.job, dry_run=args.dry_run, lock=lock)
    return enter_venv(args.job, lock)


if __name__ == "__main__":
    sys.exit(main())
