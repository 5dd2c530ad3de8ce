"""The wizard's dataset workspace: check a picked file, prepare it once per content, and remember the outcome.

Prepared files live in ``<data dir>/datasets/<stem>-<short sha>/`` (``train.jsonl``, ``eval.jsonl``,
``manifest.json``) beside a ``check.json`` that holds what the wizard shows (report, length histogram, preview), so
a reopened wizard shows the report again without re-reading the source, and picking the same content again is
instant. Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from desktop.core.data.findings import Severity
from desktop.core.data.histogram import LengthBar, length_histogram
from desktop.core.data.pairs import pair_preview
from desktop.core.data.report import DataReport
from desktop.core.runs.draft import DEFAULT_TRAINING, RunDraft
from desktop.services.data.check import CheckOutcome, Progress, check_dataset, iter_training_rows
from desktop.services.data.numbers import DataNumbers, numbers_from_manifest
from desktop.services.data.prepare import prepare_dataset
from desktop.services.data.tokens import Conversation, TokenCounter, load_token_counter
from desktop.services.platform.files import atomic_write_text, sha256_file
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths

DATASETS_DIR = "datasets"
CHECK_FILE = "check.json"
CHECK_VERSION = 2
PREVIEW_EXAMPLES = 3
SHORT_SHA = 12
#: Share of the progress bar for the check; preparing re-reads the file for the rest.
CHECK_SHARE = 0.5

Fraction = Callable[[float], None]
_log = get_logger("datasets")
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


class CheckCancelledError(Exception):
    """The check was cancelled (the user picked another file meanwhile)."""


@dataclass
class DatasetCheck:
    """What the wizard shows about a dataset file, and where its prepared files are.

    Attributes:
        source: The file checked (absolute).
        sha256: Its SHA-256 ("" when it could not be read).
        size: Its size in bytes when checked.
        mtime_ns: Its modification time when checked.
        seq_len: The sequence length lengths were checked against.
        model: The model whose tokenizer counted tokens ("" for the estimate).
        report: The check report, as :meth:`DataReport.to_dict` gives it.
        kept: Examples kept for training and evaluation (rows without errors, duplicates removed).
        histogram: Token lengths of the kept examples.
        preview: The first kept conversations.
        train_file: The prepared training file ("" when the file is unusable).
        eval_file: The prepared eval file ("" for none).
        columns: The column mapping asked for (None: guessed from the column names).
        leave_out_secrets: Whether rows with a suspected secret were left out.
        data_format: The layout found (a :class:`~desktop.core.data.formats.DataFormat` value, "" when none).
        mapping: The column mapping used for a table (None for other layouts).
        fields: The first row's fields: a table's columns, for choosing a mapping.
        fatal_kind: Why the file is unusable as a whole (a :class:`~desktop.services.data.reader.FileProblem`).
        secret_rows: Rows without errors that hold a suspected secret.
        numbers: The prepared data's numbers (None until prepared): what every step shows.
    """

    source: str
    sha256: str
    size: int
    mtime_ns: int
    seq_len: int
    model: str
    report: dict[str, Any]
    kept: int = 0
    histogram: list[LengthBar] = field(default_factory=list)
    preview: list[Conversation] = field(default_factory=list)
    train_file: str = ""
    eval_file: str = ""
    columns: dict[str, str] | None = None
    leave_out_secrets: bool = False
    data_format: str = ""
    mapping: dict[str, str] | None = None
    fields: list[str] = field(default_factory=list)
    fatal_kind: str = ""
    secret_rows: int = 0
    numbers: DataNumbers | None = None

    @property
    def fatal(self) -> str:
        """Why the file is unusable as a whole ("" when usable)."""
        return str(self.report.get("fatal") or "")

    @property
    def usable(self) -> bool:
        """Whether prepared files exist to train on."""
        return not self.fatal and self.kept > 0 and bool(self.train_file)

    def answers(self, *, seq_len: int, model: str, columns: dict[str, str] | None, leave_out_secrets: bool) -> bool:
        """Whether this check was made with these settings (else the file must be checked again)."""
        asked = (self.seq_len, self.model, self.columns or None, self.leave_out_secrets)
        return asked == (seq_len, model, columns or None, leave_out_secrets)

    def count(self, severity: Severity) -> int:
        """Findings of one severity."""
        return sum(f["count"] for f in self.report.get("findings", []) if f["severity"] == severity.value)

    def to_json(self) -> dict[str, Any]:
        """The check as JSON fields (``check.json``)."""
        return {"version": CHECK_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DatasetCheck:
        """Reads :meth:`to_json` output.

        Raises:
            ValueError: Another version of the file.
            KeyError, TypeError: Fields are missing or malformed.
        """
        fields = dict(data)
        if fields.pop("version", None) != CHECK_VERSION:
            raise ValueError(f"{CHECK_FILE} version is not {CHECK_VERSION}")
        fields["histogram"] = [LengthBar(**bar) for bar in fields["histogram"]]
        if fields.get("numbers") is not None:
            fields["numbers"] = DataNumbers(**fields["numbers"])
        return cls(**fields)


def dataset_folder(source: Path, sha256: str) -> Path:
    """Where the prepared files of ``source`` (with this content) go."""
    return app_paths().data_dir / DATASETS_DIR / f"{source.stem}-{sha256[:SHORT_SHA]}"


def _phase(
    source: Path, progress: Fraction | None, cancel: threading.Event | None, stretch: tuple[float, float]
) -> Progress:
    """A (done, total) callback feeding one stretch (start, share) of the progress bar; a cancel lands here."""
    start, share = stretch

    def report(done: int, total: int) -> None:
        if cancel is not None and cancel.is_set():
            _log.info("stopped checking %s: cancelled", source)
            raise CheckCancelledError
        if progress is not None:
            progress(start + share * min(1.0, done / max(1, total)))

    return report


def _previewed(row: dict[str, Any]) -> Conversation:
    """A training row as the preview shows it: a chat as it is, a pair's two answers by side, raw text as text."""
    if "messages" in row:
        return list(row["messages"])
    if "text" in row:
        return [{"role": "text", "content": row["text"]}]
    return pair_preview(row)


def _preview(path: Path, outcome: CheckOutcome, leave_out_secrets: bool) -> list[Conversation]:
    """The first kept conversations, or pairs (see :func:`pair_preview`); reads only as far as needed."""
    replay = CheckOutcome(DataReport(str(path)))
    kept = outcome.kept_lengths(leave_out_secrets)
    shown: list[Conversation] = []
    for line, row in iter_training_rows(path, replay, outcome.mapping, None):
        if line in kept:
            shown.append(_previewed(row))
        if len(shown) == PREVIEW_EXAMPLES:
            break  # the generator is closed (and the file with it) when it goes out of scope
    return shown


def _read_check(folder: Path) -> DatasetCheck | None:
    try:
        return DatasetCheck.from_json(json.loads((folder / CHECK_FILE).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.info("ignoring %s in %s: %s", CHECK_FILE, folder, exc)
        return None


def _files_exist(check: DatasetCheck) -> bool:
    return Path(check.train_file).is_file() and (not check.eval_file or Path(check.eval_file).is_file())


def _write_check(folder: Path, check: DatasetCheck) -> None:
    atomic_write_text(folder / CHECK_FILE, json.dumps(check.to_json(), indent=1) + "\n")


def load_saved_check(
    source: Path,
    train_file: str,
    seq_len: int,
    model: str = "",
    *,
    columns: dict[str, str] | None = None,
    leave_out_secrets: bool = False,
) -> DatasetCheck | None:
    """The remembered check of ``source`` when still valid, without reading the source.

    Valid means: the prepared files still exist, the source has the size and modification time it had when
    checked, and the settings (sequence length, model, columns, secrets) are the same.

    Args:
        source: The dataset file the user picked.
        train_file: The prepared training file the draft points at (its folder holds ``check.json``).
        seq_len: The sequence length wanted now.
        model: The model wanted now ("" for the estimate).
        columns: The column mapping wanted now (None: guessed).
        leave_out_secrets: Whether rows with suspected secrets are to be left out.
    """
    if not train_file:
        return None
    check = _read_check(Path(train_file).parent)
    try:
        stat = source.expanduser().resolve().stat()
    except OSError:
        return None
    if check is None or check.source != str(source.expanduser().resolve()):
        return None
    same_file = (check.size, check.mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    same = same_file and check.answers(
        seq_len=seq_len, model=model, columns=columns, leave_out_secrets=leave_out_secrets
    )
    return check if same and check.train_file == train_file and _files_exist(check) else None


@dataclass(frozen=True)
class _Settings:
    """What a check and preparation depend on besides the file's content."""

    seq_len: int
    model: str
    columns: dict[str, str] | None
    leave_out_secrets: bool


def _prepared_before(source: Path, sha256: str, settings: _Settings) -> DatasetCheck | None:
    """A check of the same content (wherever the file was then) with the same settings, files still there.

    The check is re-pointed at ``source`` as it is now, so :func:`load_saved_check` finds it next time.
    """
    folder = dataset_folder(source, sha256)
    check = _read_check(folder)
    if check is None or check.sha256 != sha256:
        return None
    if not check.answers(
        seq_len=settings.seq_len,
        model=settings.model,
        columns=settings.columns,
        leave_out_secrets=settings.leave_out_secrets,
    ):
        return None
    if not _files_exist(check):
        return None
    stat = source.stat()
    if (check.source, check.size, check.mtime_ns) != (str(source), stat.st_size, stat.st_mtime_ns):
        check.source, check.size, check.mtime_ns = str(source), stat.st_size, stat.st_mtime_ns
        check.report["path"] = str(source)
        _write_check(folder, check)
    return check


def _checked(
    source: Path, *, sha256: str, settings: _Settings, counter: TokenCounter, progress: Progress
) -> tuple[DatasetCheck, CheckOutcome]:
    stat = source.stat() if sha256 else None
    outcome = check_dataset(
        source, seq_len=settings.seq_len, counter=counter, columns=settings.columns, progress=progress
    )
    kept = outcome.kept_lengths(settings.leave_out_secrets)
    check = DatasetCheck(
        source=str(source),
        sha256=sha256,
        size=stat.st_size if stat else 0,
        mtime_ns=stat.st_mtime_ns if stat else 0,
        seq_len=settings.seq_len,
        model=settings.model,
        report=outcome.report.to_dict(),
        kept=len(kept),
        histogram=length_histogram(list(kept.values()), settings.seq_len),
        preview=[] if outcome.report.fatal else _preview(source, outcome, settings.leave_out_secrets),
        columns=settings.columns or None,
        leave_out_secrets=settings.leave_out_secrets,
        data_format=outcome.fmt.value if outcome.fmt else "",
        mapping=outcome.mapping,
        fields=outcome.fields,
        fatal_kind=outcome.fatal_kind.value if outcome.fatal_kind else "",
        secret_rows=len(outcome.secrets),
    )
    return check, outcome


def _prepare(check: DatasetCheck, outcome: CheckOutcome, counter: TokenCounter, progress: Progress) -> None:
    source = Path(check.source)
    folder = dataset_folder(source, check.sha256)
    prepared = prepare_dataset(
        source,
        folder,
        seq_len=check.seq_len,
        counter=counter,
        columns=check.columns,
        progress=progress,
        leave_out_secrets=check.leave_out_secrets,
        checked=outcome,
    )
    counts = prepared.manifest_data["counts"]
    check.kept = counts["train"] + counts["eval"]
    check.train_file = str(prepared.train)
    check.eval_file = str(prepared.eval or "")
    check.numbers = numbers_from_manifest(prepared.manifest_data, check.train_file)
    _write_check(folder, check)
    _log.info("prepared %s into %s (%d examples)", source, folder, check.kept)


def check_and_prepare(
    source: Path,
    *,
    seq_len: int,
    model: str = "",
    columns: dict[str, str] | None = None,
    leave_out_secrets: bool = False,
    progress: Fraction | None = None,
    cancel: threading.Event | None = None,
) -> DatasetCheck:
    """Checks a dataset file and, when usable, prepares it into the workspace (reusing an earlier preparation).

    Args:
        source: The JSONL, CSV or Parquet file picked.
        seq_len: The training sequence length.
        model: Hub id or model folder whose tokenizer counts tokens ("" for the labelled estimate).
        columns: Role → column mapping for a table (None: guessed from the column names).
        leave_out_secrets: Leave rows with a suspected secret out of the prepared files.
        progress: Called with the fraction done (0 to 1), from this thread.
        cancel: Set it to stop the work at the next progress point.

    Raises:
        CheckCancelledError: ``cancel`` was set.
        OSError: The file or the workspace could not be read or written.
        PrepareError: The file changed into an unusable one between check and preparation.
    """
    source = source.expanduser().resolve()
    settings = _Settings(seq_len, model, dict(columns) if columns else None, leave_out_secrets)
    sha256 = sha256_file(source) if source.is_file() else ""
    if not sha256:
        return _check_and_prepare(source, sha256, settings, progress, cancel)
    with _folder_lock(dataset_folder(source, sha256), cancel):
        return _check_and_prepare(source, sha256, settings, progress, cancel)


@contextmanager
def _folder_lock(folder: Path, cancel: threading.Event | None) -> Iterator[None]:
    """Holds the workspace folder while it is prepared: a second check of the same file waits, then reuses it."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(str(folder), threading.Lock())
    while not lock.acquire(timeout=0.1):
        if cancel is not None and cancel.is_set():
            raise CheckCancelledError
    try:
        yield
    finally:
        lock.release()


def _check_and_prepare(
    source: Path,
    sha256: str,
    settings: _Settings,
    progress: Fraction | None,
    cancel: threading.Event | None,
) -> DatasetCheck:
    earlier = _prepared_before(source, sha256, settings) if sha256 else None
    if earlier is not None:
        _log.info("%s was prepared before, in %s", source, Path(earlier.train_file).parent)
        return earlier
    counter = load_token_counter(settings.model or None)
    phase = _phase(source, progress, cancel, (0.0, CHECK_SHARE))
    check, outcome = _checked(source, sha256=sha256, settings=settings, counter=counter, progress=phase)
    if not check.fatal:
        _prepare(check, outcome, counter, _phase(source, progress, cancel, (CHECK_SHARE, 1.0 - CHECK_SHARE)))
    if progress is not None:
        progress(1.0)
    return check


def draft_settings(draft: RunDraft) -> dict[str, Any]:
    """The settings a draft's data is checked and prepared with (keyword arguments of :func:`check_and_prepare`)."""
    return {
        "seq_len": int(draft.training.get("seq_len", DEFAULT_TRAINING["seq_len"])),
        "model": draft.base_model,
        "columns": dict(draft.data_columns) or None,
        "leave_out_secrets": draft.leave_out_secrets,
    }


def prepare_for_draft(
    draft: RunDraft, *, progress: Fraction | None = None, cancel: threading.Event | None = None
) -> DatasetCheck | None:
    """The draft's dataset checked and prepared for its model, sequence length, columns and secrets choice.

    The remembered check is used when it still answers for those settings; otherwise the file is checked and
    prepared again (the tokens are counted with the chosen model's tokenizer). Blocking: call it off the UI thread.

    Returns:
        The check (its ``numbers`` are what every step shows), or None when the draft has no dataset file.

    Raises:
        CheckCancelledError: ``cancel`` was set.
        OSError: The file or the workspace could not be read or written.
        PrepareError: The file changed into an unusable one between check and preparation.
    """
    if not draft.data_file:
        return None
    source, settings = Path(draft.data_file), draft_settings(draft)
    saved = load_saved_check(source, draft.train_file, **settings)
    return saved or check_and_prepare(source, **settings, progress=progress, cancel=cancel)
