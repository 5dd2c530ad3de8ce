"""``rentune publish``: the adapter (and, if asked, what was exported from it) to a Hugging Face Hub repo.

The repo is private unless ``--public``; the token comes from the keyring (``rentune keys set huggingface``) or
``HF_TOKEN``. A model card written from the run goes with it: base model, settings, data size, loss curve, the
evaluation's verdict when there is one, GPU, time and cost.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from desktop.services.local.common import LocalInputError, LocalToolError
from desktop.services.local.inventory import ExportKind, exports_folder, scan_exports
from desktop.services.platform.secrets import SecretStore
from desktop.services.publishing.hub import PublishRequest, publish
from desktop.services.runs.outputs import AdapterSource, AdapterSourceError, resolve_adapter


def run_publish(args: argparse.Namespace) -> int:
    """``rentune publish ADAPTER_DIR_OR_RUN_ID --repo NAME [--public] [--exports] [--add PATH ...]``."""
    try:
        source = resolve_adapter(args.adapter)
    except AdapterSourceError as exc:
        raise CliError(str(exc)) from exc
    extra = tuple(_exports(source) if args.exports else ()) + tuple(path.expanduser() for path in args.add or ())
    request = PublishRequest(args.repo, source, extra, private=not args.public)
    try:
        published = asyncio.run(publish(request, SecretStore(), progress=_show_progress))
    except LocalToolError as exc:
        raise CliError(str(exc), EXIT_USAGE if isinstance(exc, LocalInputError) else EXIT_FAILED) from exc
    visibility = "public" if args.public else "private unless it existed already"
    print(f"Published {len(published.files)} files to {published.url} ({visibility}), commit {published.commit[:12]}:")
    for name in published.files:
        print(f"  {name}")
    return EXIT_OK


def _exports(source: AdapterSource) -> list[Path]:
    """The run's GGUF files and merged model, as exported on this computer."""
    if source.run_id is None:
        raise CliError("--exports needs a run id (an adapter folder has no export folder); use --add PATH instead")
    kinds = (ExportKind.GGUF, ExportKind.MERGED)
    found = [item.path for item in scan_exports(exports_folder(source.run_id)) if item.kind in kinds]
    if not found:
        raise CliError(f"run {source.run_id} has no GGUF or merged export yet: rentune export {source.run_id} first")
    return found


def _show_progress(text: str, fraction: float | None) -> None:
    shown = "" if fraction is None else f" ({fraction:.0%})"
    print(f"publish: {text}{shown}", file=sys.stderr, flush=True)
