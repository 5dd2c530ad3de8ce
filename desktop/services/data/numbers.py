"""The prepared data's numbers: one answer, read from its manifest, for every step that shows them.

The Data step, the Sizing step and the Review all show rows, problems, tokens per epoch and the tokenizer that
counted them from a :class:`DataNumbers`, so they cannot disagree. A manifest answers for the settings it was
prepared with (model, sequence length, column mapping, secrets left out or not); :meth:`DataNumbers.matches`
says whether that is still what the run asks for, and when it is not the data is prepared again
(:func:`desktop.services.data.workspace.prepare_for_draft`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.services.data.prepare import EVAL_NAME, read_manifest


@dataclass(frozen=True)
class DataNumbers:
    """What the prepared data holds and how it was counted.

    Attributes:
        rows: Rows read from the source.
        rows_with_errors: Rows left out because they have at least one error.
        error_problems: Errors found (a row can have several, so this can exceed ``rows_with_errors``).
        warning_problems: Warnings found (duplicates, long examples, suspected secrets...).
        duplicates_removed: Repeated rows left out.
        secret_rows: Rows without errors that hold a suspected secret.
        secrets_left_out: Whether those rows were left out of the prepared files.
        train_examples: Examples in the training file.
        eval_examples: Examples in the eval file.
        train_tokens: Tokens trained per epoch: the training file's examples, each cut to the sequence length.
        seq_len: The sequence length the examples were measured against.
        too_long: Kept examples longer than the sequence length.
        cut_tokens: Tokens truncation removes from those.
        percentiles: Lengths of the kept examples (``p50``, ``p90``, ``p99``, ``max``).
        model: The model the data was counted for ("" when none was chosen), even when its tokenizer was missing.
        exact: Whether that model's tokenizer counted (False: the estimate).
        estimate_reason: Why the estimate was used ("" when exact).
        data_format: The source's layout (a :class:`~desktop.core.data.formats.DataFormat` value).
        columns: The column mapping used for a table, or None.
        train_file: The prepared training file.
        eval_file: The prepared eval file ("" for none).
    """

    rows: int
    rows_with_errors: int
    error_problems: int
    warning_problems: int
    duplicates_removed: int
    secret_rows: int
    secrets_left_out: bool
    train_examples: int
    eval_examples: int
    train_tokens: int
    seq_len: int
    too_long: int
    cut_tokens: int
    percentiles: dict[str, int] = field(default_factory=dict)
    model: str = ""
    exact: bool = False
    estimate_reason: str = ""
    data_format: str = ""
    columns: dict[str, str] | None = None
    train_file: str = ""
    eval_file: str = ""

    @property
    def kept(self) -> int:
        """Examples prepared (training and eval)."""
        return self.train_examples + self.eval_examples

    def matches(
        self, *, model: str, seq_len: int, leave_out_secrets: bool, columns: dict[str, str] | None = None
    ) -> bool:
        """Whether these numbers answer for these settings; False means the data must be prepared again.

        Args:
            model: The model chosen now ("" for none).
            seq_len: The sequence length chosen now.
            leave_out_secrets: Whether rows with suspected secrets are to be left out.
            columns: The column mapping chosen for a table (None or empty: the guessed one is fine).
        """
        same = (self.model, self.seq_len, self.secrets_left_out) == (model, seq_len, leave_out_secrets)
        return same and (not columns or columns == self.columns)

    def tokens_source(self) -> str:
        """How the tokens per epoch were counted, as the sizing states it."""
        how = (
            f"counted with the tokenizer of {self.model}" if self.exact else "estimated at about 4 characters per token"
        )
        return f"{self.train_examples:,} training examples of the prepared data, {how}"


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    return int(value) if isinstance(value, (int, float)) else 0


def _section(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    value = manifest.get(key)
    return value if isinstance(value, dict) else {}


def numbers_from_manifest(manifest: dict[str, Any], train_file: str) -> DataNumbers | None:
    """The numbers a manifest states (None when it lacks the counts); ``train_file`` is the file beside it."""
    counts, tokens = manifest.get("counts"), manifest.get("tokens")
    if not isinstance(counts, dict) or not isinstance(tokens, dict):
        return None
    counted, problems, secrets = (_section(manifest, key) for key in ("counted_with", "problems", "secrets"))
    train, evaluation = _int(counts, "train"), _int(counts, "eval")
    trained = _int(tokens, "trained_per_epoch")
    share = train / (train + evaluation) if train + evaluation else 1.0
    eval_file = Path(train_file).parent / EVAL_NAME if evaluation else None
    return DataNumbers(
        rows=_int(counts, "rows"),
        rows_with_errors=_int(counts, "with_errors"),
        error_problems=_int(problems, "errors") or _int(counts, "with_errors"),
        warning_problems=_int(problems, "warnings"),
        duplicates_removed=_int(counts, "duplicates_removed"),
        secret_rows=_int(secrets, "rows"),
        secrets_left_out=bool(secrets.get("left_out", False)),
        train_examples=train,
        eval_examples=evaluation,
        train_tokens=_int(tokens, "train_per_epoch") if "train_per_epoch" in tokens else round(trained * share),
        seq_len=_int(tokens, "seq_len"),
        too_long=_int(tokens, "too_long"),
        cut_tokens=_int(tokens, "cut"),
        percentiles={k: int(v) for k, v in dict(tokens.get("percentiles") or {}).items()},
        model=str(counted.get("model") or ""),
        exact=bool(counted.get("exact", False)),
        estimate_reason=str(counted.get("reason") or ""),
        data_format=str(manifest.get("format") or ""),
        columns=dict(manifest["columns"]) if isinstance(manifest.get("columns"), dict) else None,
        train_file=train_file,
        eval_file=str(eval_file or ""),
    )


def read_data_numbers(train_file: str) -> DataNumbers | None:
    """The numbers of the data prepared into ``train_file``'s folder, or None when there is none (blocking)."""
    manifest = read_manifest(train_file)
    return numbers_from_manifest(manifest, train_file) if manifest else None
