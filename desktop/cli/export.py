"""``rentune export``: an adapter (a folder or a run id) turned into models that run on this computer.

``--json`` prints one object: ``merged`` (folder), ``gguf`` (quantisation type to file), ``lora_gguf`` and
``base_gguf`` (files), ``modelfile`` (file), ``mlx`` (folder), each null when not asked for; ``merge_check``
(the merge's largest logit difference and the tolerance), ``mlx_sample`` and ``notes``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from desktop.services.local.common import LocalInputError, LocalToolError
from desktop.services.local.export import ExportRequest, ExportResult, export, with_defaults
from desktop.services.runs.outputs import AdapterSource, AdapterSourceError, resolve_adapter


class StderrProgress:
    """Prints each step once (and its percentage when it moves by 10 points) to stderr."""

    def __init__(self) -> None:
        self._last: tuple[str, int] | None = None

    def __call__(self, text: str, fraction: float | None) -> None:
        """Reports one step."""
        shown = (text, -1 if fraction is None else int(fraction * 10))
        if shown == self._last:
            return
        self._last = shown
        percent = "" if fraction is None else f" ({fraction:.0%})"
        print(f"{text}{percent}", file=sys.stderr, flush=True)


def source_of(reference: str) -> AdapterSource:
    """The adapter a command names, as a CLI error when it names none."""
    try:
        return resolve_adapter(reference)
    except AdapterSourceError as exc:
        raise CliError(str(exc)) from exc


def _request(args: argparse.Namespace, source: AdapterSource) -> ExportRequest:
    return ExportRequest(
        adapter=source.adapter,
        base=args.base or source.base,
        out=(args.out or source.default_out("export")).expanduser().resolve(),
        merged=args.merge,
        gguf=tuple(dict.fromkeys(args.gguf or ())),
        lora_gguf=args.lora_gguf,
        base_gguf=args.base_gguf,
        ollama=args.ollama,
        mlx=args.mlx,
    )


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def result_json(request: ExportRequest, result: ExportResult) -> dict[str, Any]:
    """What was written, as ``--json`` prints it."""
    check = result.merge_check
    return {
        "merged": _path(result.merged),
        "gguf": {qtype: str(path) for qtype, path in result.gguf.items()} if request.gguf else None,
        "lora_gguf": _path(result.lora_gguf),
        "base_gguf": _path(result.base_gguf),
        "modelfile": _path(result.modelfile),
        "mlx": _path(result.mlx),
        "merge_check": None
        if check is None
        else {"max_difference": check.max_difference, "tolerance": check.tolerance, "merged_in": check.merged_in},
        "mlx_sample": result.mlx_sample,
        "notes": result.notes,
    }


def _summary(result: dict[str, Any]) -> str:
    lines = [f"merged model: {result['merged']}"] if result["merged"] else []
    lines += [f"GGUF {qtype}: {path}" for qtype, path in (result["gguf"] or {}).items()]
    names = {"lora_gguf": "GGUF LoRA", "base_gguf": "base GGUF", "modelfile": "Ollama Modelfile", "mlx": "MLX model"}
    lines += [f"{label}: {result[key]}" for key, label in names.items() if result[key]]
    if result["modelfile"]:
        lines.append(f"  try it: ollama create my-model -f {result['modelfile']}")
    return "\n".join(lines + [f"note: {note}" for note in result["notes"]])


def run_export(args: argparse.Namespace) -> int:
    """Exports the adapter as asked; prints what was written."""
    request = with_defaults(_request(args, source_of(args.adapter)))
    try:
        result = asyncio.run(export(request, StderrProgress()))
    except LocalToolError as exc:
        raise CliError(str(exc), EXIT_USAGE if isinstance(exc, LocalInputError) else EXIT_FAILED) from exc
    shown = result_json(request, result)
    print(json.dumps(shown, indent=2) if args.json else _summary(shown))
    return EXIT_OK
