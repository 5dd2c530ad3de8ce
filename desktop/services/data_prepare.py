"""Preparing a checked dataset for upload.

Drops rows with errors and duplicates, splits train/eval, and writes ``messages`` JSONL plus a manifest, so that a
run uploads exactly what was checked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from desktop.core.data.report import DataReport, token_stats
from desktop.core.data.split import eval_indices
from desktop.services.data_check import CheckOutcome, Progress, check_dataset, iter_conversations
from desktop.services.files import sha256_file
from desktop.services.token_counting import EstimatedTokenCounter, TokenCounter

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


class PrepareError(ValueError):
    """The dataset cannot be prepared; the message says why."""


@dataclass(frozen=True)
class Prepared:
    """What ``prepare`` wrote.

    Attributes:
        train: The training file.
        eval: The eval file, or ``None`` with an eval fraction of 0.
        manifest: The manifest file.
        report: The check report of the source.
        manifest_data: The manifest's content.
    """

    train: Path
    eval: Path | None
    manifest: Path
    report: DataReport
    manifest_data: dict[str, Any]


def _write_splits(
    path: Path, out_dir: Path, outcome: CheckOutcome, evals: set[int], columns: Mapping[str, str] | None
) -> tuple[int, int]:
    encoder = msgspec.json.Encoder()
    counts = [0, 0]
    replay = CheckOutcome(DataReport(str(path)))
    with (out_dir / "train.jsonl.part").open("wb") as train, (out_dir / "eval.jsonl.part").open("wb") as evaluation:
        for line, messages in iter_conversations(path, replay, columns, None):
            if line in outcome.duplicates or line not in outcome.lengths:
                continue
            target = evaluation if line in evals else train
            target.write(encoder.encode({"messages": messages}) + b"\n")
            counts[target is evaluation] += 1
    return counts[0], counts[1]


def _manifest(
    path: Path,
    *,
    outcome: CheckOutcome,
    counts: tuple[int, int],
    options: dict[str, Any],
    kept_lengths: list[int],
    counter: TokenCounter,
    seq_len: int,
) -> dict[str, Any]:
    report = outcome.report
    stats = token_stats(kept_lengths, seq_len, counter.description)
    return {
        "schema_version": MANIFEST_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": {
            "path": str(path.resolve()),
            "sha256": sha256_file(path),
            "bytes": path.stat().st_size,
            "format": report.format,
        },
        "counts": {
            "rows": report.rows,
            "with_errors": report.rows - report.valid,
            "duplicates_removed": len(outcome.duplicates),
            "train": counts[0],
            "eval": counts[1],
        },
        "tokens": {
            "method": stats.method,
            "seq_len": seq_len,
            "trained_per_epoch": stats.trained,
            "total": stats.total,
            "cut": stats.cut,
            "too_long": stats.too_long,
            "percentiles": stats.percentiles,
        },
        "tokenizer": counter.description,
        **options,
    }


def prepare_dataset(
    path: Path,
    out_dir: Path,
    *,
    seq_len: int = 2048,
    eval_fraction: float = 0.05,
    seed: int = 42,
    counter: TokenCounter | None = None,
    columns: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> Prepared:
    """Checks ``path``, then writes ``train.jsonl``, ``eval.jsonl`` and ``manifest.json`` into ``out_dir``.

    Rows with errors and repeated rows are left out; the split is seeded and stratified by length. Files appear
    complete or not at all (written under a temporary name, then renamed).

    Raises:
        PrepareError: The source is unusable or the eval fraction is out of range.
    """
    if not 0 <= eval_fraction < 0.5:
        raise PrepareError(f"--eval-fraction {eval_fraction:g} must be at least 0 and below 0.5")
    counter = counter or EstimatedTokenCounter()
    outcome = check_dataset(path, seq_len=seq_len, counter=counter, columns=columns, progress=progress)
    if outcome.report.fatal:
        raise PrepareError(f"{path}: {outcome.report.fatal}")
    kept = outcome.kept_lengths()
    out_dir.mkdir(parents=True, exist_ok=True)
    evals = eval_indices(kept, eval_fraction, seed)
    counts = _write_splits(path, out_dir, outcome, evals, outcome.mapping or columns)
    options = {"seed": seed, "eval_fraction": eval_fraction}
    manifest = _manifest(
        path,
        outcome=outcome,
        counts=counts,
        options=options,
        kept_lengths=list(kept.values()),
        counter=counter,
        seq_len=seq_len,
    )
    (out_dir / "train.jsonl.part").replace(out_dir / "train.jsonl")
    eval_path: Path | None = out_dir / "eval.jsonl"
    if counts[1]:
        (out_dir / "eval.jsonl.part").replace(out_dir / "eval.jsonl")
    else:
        (out_dir / "eval.jsonl.part").unlink()
        eval_path = None
    manifest["files"] = {p.name: sha256_file(p) for p in (out_dir / "train.jsonl", eval_path) if p is not None}
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return Prepared(out_dir / "train.jsonl", eval_path, out_dir / MANIFEST_NAME, outcome.report, manifest)
