"""Preparing a checked dataset for upload.

Drops rows with errors and duplicates, splits train/eval, and writes JSONL (``messages`` rows, preference pairs, or
raw text documents) plus a manifest, so that a run uploads exactly what was checked. A running text (a ``.txt``
file) holds out its last paragraphs and is written back as whole documents, not one per paragraph.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from desktop.core.data.findings import Severity
from desktop.core.data.formats import DataFormat
from desktop.core.data.report import DataReport, token_stats
from desktop.core.data.split import eval_indices, tail_indices
from desktop.services.data.check import CheckOutcome, Progress, check_dataset, iter_training_rows
from desktop.services.data.reader import TEXT_SUFFIXES
from desktop.services.data.tokens import EstimatedTokenCounter, TokenCounter
from desktop.services.platform.files import atomic_write_text, atomic_writer, commit_file_set, sha256_file
from desktop.services.platform.logs import get_logger

MANIFEST_NAME = "manifest.json"
TRAIN_NAME = "train.jsonl"
EVAL_NAME = "eval.jsonl"
MANIFEST_VERSION = 1
#: The longest document written from a running text (a ``.txt`` file's paragraphs), in characters: the payload's
#: own piece size for a ``.txt`` it reads (see ``trainer_payload.texts``).
PIECE_CHARS = 1_000_000
_log = get_logger("datasets")


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
    path: Path,
    staging: Path,
    *,
    kept: Mapping[int, int],
    evals: set[int],
    columns: Mapping[str, str] | None,
    progress: Progress | None,
    running_text: bool = False,
) -> tuple[int, int]:
    encoder = msgspec.json.Encoder()
    counts = [0, 0]
    replay = CheckOutcome(DataReport(str(path)))
    with atomic_writer(staging / TRAIN_NAME) as train, atomic_writer(staging / EVAL_NAME) as evaluation:
        joined = {id(train): _Joiner(train, encoder), id(evaluation): _Joiner(evaluation, encoder)}
        for line, row in iter_training_rows(path, replay, columns, progress):
            if line not in kept:
                continue
            target = evaluation if line in evals else train
            if running_text:
                joined[id(target)].add(row["text"])
            else:
                target.write(encoder.encode(row) + b"\n")
            counts[target is evaluation] += 1
        for joiner in joined.values():
            joiner.flush()
    return counts[0], counts[1]


class _Joiner:
    """Writes a running text's kept paragraphs back as documents of up to :data:`PIECE_CHARS` characters.

    A paragraph is not a document: the trainer puts an end-of-text token between documents. Joined, the text runs on
    as it did in the file (repeated paragraphs left out); pieces keep each document small enough to tokenise.
    """

    def __init__(self, handle: Any, encoder: msgspec.json.Encoder) -> None:
        self.handle, self.encoder = handle, encoder
        self.parts: list[str] = []
        self.size = 0

    def add(self, paragraph: str) -> None:
        if self.size + len(paragraph) > PIECE_CHARS:
            self.flush()
        self.parts.append(paragraph)
        self.size += len(paragraph) + 2

    def flush(self) -> None:
        if self.parts:
            self.handle.write(self.encoder.encode({"text": "\n\n".join(self.parts)}) + b"\n")
        self.parts, self.size = [], 0


def _manifest(
    path: Path,
    *,
    outcome: CheckOutcome,
    counts: tuple[int, int],
    options: dict[str, Any],
    kept: Mapping[int, int],
    evals: set[int],
    counter: TokenCounter,
    seq_len: int,
) -> dict[str, Any]:
    report = outcome.report
    packed = outcome.fmt is DataFormat.TEXT  # raw text runs on into the next sequence: nothing is cut
    stats = token_stats(list(kept.values()), seq_len, counter.description, packed=packed)
    # A pair's two answers both train, each padded to the longer: the planner counts the tokens of both.
    sides = 2 if outcome.fmt is DataFormat.PAIRS else 1
    trained = [n if packed else min(n, seq_len) for line, n in kept.items() if line not in evals]
    train_tokens = sides * sum(trained)
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
            "trained_per_epoch": sides * stats.trained,
            "sequences_per_example": sides,
            "train_per_epoch": train_tokens,
            "total": stats.total,
            "cut": stats.cut,
            "too_long": stats.too_long,
            "percentiles": stats.percentiles,
        },
        "tokenizer": counter.description,
        "counted_with": {"model": counter.model, "exact": counter.exact, "reason": counter.reason},
        "problems": {"errors": outcome.problems(Severity.ERROR), "warnings": outcome.problems(Severity.WARNING)},
        "secrets": {"rows": len(outcome.secrets), "left_out": bool(options.get("leave_out_secrets"))},
        "format": outcome.fmt.value if outcome.fmt else "",
        "columns": outcome.mapping,
        **options,
    }


def _make_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise PrepareError(f"{out_dir} is a file; choose a folder for the prepared files (a new one is created)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrepareError(f"the folder {out_dir} cannot be created ({exc.strerror or exc}); choose another") from exc


def _commit(out_dir: Path, staging: Path, manifest: dict[str, Any]) -> None:
    """Records the staged files' hashes in the manifest, then moves the set into ``out_dir``, the manifest last."""
    names = [TRAIN_NAME, EVAL_NAME] if manifest["counts"]["eval"] else [TRAIN_NAME]
    manifest["files"] = {name: sha256_file(staging / name) for name in names}
    atomic_write_text(staging / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
    files = {name: staging / name if name in names else None for name in (TRAIN_NAME, EVAL_NAME)}
    commit_file_set(out_dir, files, marker=staging / MANIFEST_NAME)


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
    leave_out_secrets: bool = False,
    checked: CheckOutcome | None = None,
) -> Prepared:
    """Checks ``path``, then writes ``train.jsonl``, ``eval.jsonl`` and ``manifest.json`` into ``out_dir``.

    Rows with errors and repeated rows are left out (and rows with a suspected secret, if asked); the split is
    seeded and stratified by length. The files are written into a hidden folder inside ``out_dir`` first and moved
    in as a set, the manifest last: a folder with a manifest always holds the set it describes, and a prepare that
    fails leaves the previous set as it was.

    Args:
        path: The JSONL, CSV or Parquet file.
        out_dir: The folder for the prepared files (created when missing).
        seq_len: The training sequence length (longer examples are counted as cut to it).
        eval_fraction: Share of the examples held out for evaluation (0 for none).
        seed: Seed of the train/eval split.
        counter: Token counter; the labelled estimate by default.
        columns: Role → column mapping for tabular files (guessed when omitted).
        progress: Called with (bytes done, total bytes) now and then.
        leave_out_secrets: Leave rows with a suspected secret out of both files.
        checked: The outcome of checking ``path`` with the same counter, sequence length and columns, when the
            caller has one (the check is then not repeated).

    Raises:
        PrepareError: The source is unusable, the eval fraction is out of range, or ``out_dir`` cannot be written.
    """
    if not 0 <= eval_fraction < 0.5:
        raise PrepareError(f"--eval-fraction {eval_fraction:g} must be at least 0 and below 0.5")
    counter = counter or EstimatedTokenCounter()
    outcome = checked or check_dataset(path, seq_len=seq_len, counter=counter, columns=columns, progress=progress)
    if outcome.report.fatal:
        raise PrepareError(f"{path}: {outcome.report.fatal}")
    _make_out_dir(out_dir)
    kept = outcome.kept_lengths(leave_out_secrets)
    running_text = outcome.fmt is DataFormat.TEXT and path.suffix.lower() in TEXT_SUFFIXES
    evals = tail_indices(kept, eval_fraction) if running_text else eval_indices(kept, eval_fraction, seed)
    options = {"seed": seed, "eval_fraction": eval_fraction, "leave_out_secrets": leave_out_secrets}
    try:
        with tempfile.TemporaryDirectory(prefix=".prepare-", dir=out_dir, ignore_cleanup_errors=True) as folder:
            written = progress if checked is not None else None
            counts = _write_splits(
                path,
                Path(folder),
                kept=kept,
                evals=evals,
                columns=outcome.mapping or columns,
                progress=written,
                running_text=running_text,
            )
            manifest = _manifest(
                path,
                outcome=outcome,
                counts=counts,
                options=options,
                kept=kept,
                evals=evals,
                counter=counter,
                seq_len=seq_len,
            )
            _commit(out_dir, Path(folder), manifest)
    except OSError as exc:
        raise PrepareError(
            f"the prepared files could not be written to {out_dir} ({exc.strerror or exc}); check the folder's "
            "permissions and the free disk space"
        ) from exc
    eval_path = out_dir / EVAL_NAME if counts[1] else None
    return Prepared(out_dir / TRAIN_NAME, eval_path, out_dir / MANIFEST_NAME, outcome.report, manifest)


def read_manifest(train_file: str) -> dict[str, Any] | None:
    """The manifest ``prepare_dataset`` wrote next to the training file, if there is one (blocking)."""
    if not train_file:
        return None
    path = Path(train_file).expanduser().parent / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        _log.info("no usable manifest at %s (%s); sizing with the default token count", path, exc)
        return None
    return data if isinstance(data, dict) else None


def counted_words(manifest: dict[str, Any]) -> str:
    """How a manifest's tokens were counted, in words: ``counted with the tokenizer of X`` or the estimate."""
    counted = manifest.get("counted_with")
    if isinstance(counted, dict) and counted.get("exact"):
        return f"counted with the tokenizer of {counted.get('model') or 'the model'}"
    if isinstance(counted, dict):
        return "estimated at about 4 characters per token"
    method = str(manifest.get("tokens", {}).get("method", "counted"))
    return method if method.startswith("counted") else f"counted by the {method}"


def manifest_tokens(manifest: dict[str, Any]) -> tuple[int, str] | None:
    """Training tokens per epoch from a manifest (the eval split left out), and how they were counted.

    Manifests written before the training split's own count share the total out by examples.
    """
    try:
        tokens, counts = manifest["tokens"], manifest["counts"]
        trained, train, evaluation = int(tokens["trained_per_epoch"]), int(counts["train"]), int(counts["eval"])
        exact = tokens.get("train_per_epoch")
        if exact is None:
            share = train / (train + evaluation) if train + evaluation else 1.0
            exact = round(trained * share)
        exact = int(exact)
    except (KeyError, TypeError, ValueError):
        return None
    return max(1, exact), f"{train:,} training examples of the prepared data, {counted_words(manifest)}"
