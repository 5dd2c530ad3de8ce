"""The wizard's dataset workspace: check a picked file, prepare it once per content, and remember the outcome.

Prepared files live in ``<data dir>/datasets/<stem>-<short sha>/`` (``train.jsonl``, ``eval.jsonl``,
``manifest.json``) beside a ``check.json`` that holds what the wizard shows (report, length histogram, preview), so
a reopened wizard shows the report again without re-reading the source, and picking the same content again is
instant. Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from desktop.core.data.findings import Severity
from desktop.core.data.histogram import LengthBar, length_histogram
from desktop.core.data.report import DataReport
from desktop.services.data.check import CheckOutcome, Progress, check_dataset, iter_conversations
from desktop.services.data.prepare import prepare_dataset
from desktop.services.data.tokens import Conversation, TokenCounter, load_token_counter
from desktop.services.platform.files import atomic_write_text, sha256_file
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths

DATASETS_DIR = "datasets"
CHECK_FILE = "check.json"
CHECK_VERSION = 1
PREVIEW_EXAMPLES = 3
SHORT_SHA = 12
#: Share of the progress bar for the check; preparing re-reads the file for the rest.
CHECK_SHARE = 0.5

Fraction = Callable[[float], None]
_log = get_logger("datasets")


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

    @property
    def fatal(self) -> str:
        """Why the file is unusable as a whole ("" when usable)."""
        return str(self.report.get("fatal") or "")

    @property
    def usable(self) -> bool:
        """Whether prepared files exist to train on."""
        return not self.fatal and self.kept > 0 and bool(self.train_file)

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


def _preview(path: Path, outcome: CheckOutcome) -> list[Conversation]:
    """The first kept conversations (reads only as far as needed)."""
    replay = CheckOutcome(DataReport(str(path)))
    shown: list[Conversation] = []
    for line, messages in iter_conversations(path, replay, outcome.mapping, None):
        if line in outcome.lengths and line not in outcome.duplicates:
            shown.append(messages)
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


def load_saved_check(source: Path, train_file: str, seq_len: int, model: str = "") -> DatasetCheck | None:
    """The remembered check of ``source`` when still valid, without reading the source.

    Valid means: the prepared files still exist, the source has the size and modification time it had when
    checked, and the sequence length and model are the same.

    Args:
        source: The dataset file the user picked.
        train_file: The prepared training file the draft points at (its folder holds ``check.json``).
        seq_len: The sequence length wanted now.
        model: The model wanted now ("" for the estimate).
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
    same = (check.size, check.mtime_ns, check.seq_len, check.model) == (stat.st_size, stat.st_mtime_ns, seq_len, model)
    return check if same and check.train_file == train_file and _files_exist(check) else None


def _prepared_before(source: Path, sha256: str, seq_len: int, model: str) -> DatasetCheck | None:
    """A check of the same content (wherever the file was then) with the same settings, files still there.

    The check is re-pointed at ``source`` as it is now, so :func:`load_saved_check` finds it next time.
    """
    folder = dataset_folder(source, sha256)
    check = _read_check(folder)
    if check is None or (check.sha256, check.seq_len, check.model) != (sha256, seq_len, model):
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
    source: Path, *, sha256: str, seq_len: int, model: str, counter: TokenCounter, progress: Progress
) -> DatasetCheck:
    stat = source.stat() if sha256 else None
    outcome = check_dataset(source, seq_len=seq_len, counter=counter, progress=progress)
    kept = outcome.kept_lengths()
    return DatasetCheck(
        source=str(source),
        sha256=sha256,
        size=stat.st_size if stat else 0,
        mtime_ns=stat.st_mtime_ns if stat else 0,
        seq_len=seq_len,
        model=model,
        report=outcome.report.to_dict(),
        kept=len(kept),
        histogram=length_histogram(list(kept.values()), seq_len),
        preview=[] if outcome.report.fatal else _preview(source, outcome),
    )


def _prepare(check: DatasetCheck, counter: TokenCounter, progress: Progress) -> None:
    source = Path(check.source)
    folder = dataset_folder(source, check.sha256)
    prepared = prepare_dataset(source, folder, seq_len=check.seq_len, counter=counter, progress=progress)
    counts = prepared.manifest_data["counts"]
    check.kept = counts["train"] + counts["eval"]
    check.train_file = str(prepared.train)
    check.eval_file = str(prepared.eval or "")
    _write_check(folder, check)
    _log.info("prepared %s into %s (%d examples)", source, folder, check.kept)


def check_and_prepare(
    source: Path,
    *,
    seq_len: int,
    model: str = "",
    progress: Fraction | None = None,
    cancel: threading.Event | None = None,
) -> DatasetCheck:
    """Checks a dataset file and, when usable, prepares it into the workspace (reusing an earlier preparation).

    Args:
        source: The JSONL, CSV or Parquet file picked.
        seq_len: The training sequence length.
        model: Hub id or model folder whose tokenizer counts tokens ("" for the labelled estimate).
        progress: Called with the fraction done (0 to 1), from this thread.
        cancel: Set it to stop the work at the next progress point.

    Raises:
        CheckCancelledError: ``cancel`` was set.
        OSError: The file or the workspace could not be read or written.
        PrepareError: The file changed into an unusable one between check and preparation.
    """
    source = source.expanduser().resolve()
    sha256 = sha256_file(source) if source.is_file() else ""
    earlier = _prepared_before(source, sha256, seq_len, model) if sha256 else None
    if earlier is not None:
        _log.info("%s was prepared before, in %s", source, Path(earlier.train_file).parent)
        return earlier
    counter = load_token_counter(model or None)
    phase = _phase(source, progress, cancel, (0.0, CHECK_SHARE))
    check = _checked(source, sha256=sha256, seq_len=seq_len, model=model, counter=counter, progress=phase)
    if not check.fatal:
        _prepare(check, counter, _phase(source, progress, cancel, (CHECK_SHARE, 1.0 - CHECK_SHARE)))
    if progress is not None:
        progress(1.0)
    return check
