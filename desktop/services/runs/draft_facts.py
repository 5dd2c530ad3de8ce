"""One answer to "what will this run train on, and what does it need": the draft's data numbers and its sizing.

The Sizing step and the Review call :func:`draft_facts`; the Data step shows the same
:class:`~desktop.services.data.numbers.DataNumbers`. When the model, the sequence length, the column mapping or
the secrets choice changed since the data was prepared, the data is prepared again first (tokens counted with the
chosen model's tokenizer), and the sizing is made with exactly those tokens. No step shows a stale count.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from desktop.core.runs.draft import RunDraft
from desktop.services.data.numbers import DataNumbers, read_data_numbers
from desktop.services.data.prepare import PrepareError
from desktop.services.data.workspace import DatasetCheck, prepare_for_draft
from desktop.services.models.sizing import Sizing, SizingError, size_run
from desktop.services.platform.logs import get_logger
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.drafts import learned_from_runs

_log = get_logger("drafts")


@dataclass(frozen=True)
class DraftFacts:
    """The draft's data and sizing, counted for its current settings.

    Attributes:
        source_file: The dataset file as the draft named it when these facts were made.
        check: The dataset check and preparation the numbers come from (None without a dataset file).
        numbers: The prepared data's numbers (None when there is no usable prepared data). Without a dataset file
            (a draft from an older version, or made by hand) they are the manifest's next to ``train_file``.
        sizing: The plan made with those numbers (None when the job cannot be sized).
        sizing_error: Why it cannot be sized (headline, details and the setting that fixes it).
        data_error: Why the data could not be prepared again ("" when it was, or did not need to be).
    """

    source_file: str
    check: DatasetCheck | None
    numbers: DataNumbers | None
    sizing: Sizing | None
    sizing_error: SizingError | None = None
    data_error: str = ""

    def apply(self, draft: RunDraft) -> bool:
        """Points ``draft`` at the files these numbers describe; True when that changed it.

        Nothing changes when the draft's dataset is no longer the one counted (the user picked another meanwhile).
        """
        check = self.check
        if check is None or not check.usable or draft.data_file != self.source_file:
            return False
        changed = (draft.train_file, draft.eval_file) != (check.train_file, check.eval_file)
        draft.train_file, draft.eval_file = check.train_file, check.eval_file
        return changed


def draft_facts(
    draft: RunDraft,
    secrets: SecretStore | None = None,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> DraftFacts:
    """The draft's data numbers for its current settings (preparing the data again if needed) and its sizing.

    Blocking (files, a tokenizer, maybe the network): call it off the UI thread. The draft is not changed; call
    :meth:`DraftFacts.apply` on the UI thread to point it at the files the numbers describe.

    Args:
        draft: The run being set up.
        secrets: Where a Hugging Face token for gated models is kept.
        progress: Called with the fraction of a re-preparation done.
        cancel: Set it to stop a re-preparation at its next progress point.

    Raises:
        desktop.services.data.workspace.CheckCancelledError: ``cancel`` was set.
    """
    check, data_error = _prepared(draft, progress, cancel)
    numbers = check.numbers if check is not None and check.usable else None
    if check is None and not data_error and draft.train_file:
        numbers = read_data_numbers(draft.train_file)
    counted = (numbers.train_tokens, numbers.tokens_source()) if numbers is not None else None
    sized = draft.model_copy(deep=True)
    if numbers is not None:
        sized.train_file, sized.eval_file = numbers.train_file, numbers.eval_file
    try:
        sizing, error = size_run(sized, counted, secrets, learned_from_runs), None
    except SizingError as exc:
        sizing, error = None, exc
    return DraftFacts(draft.data_file, check, numbers, sizing, error, data_error)


def _prepared(
    draft: RunDraft, progress: Callable[[float], None] | None, cancel: threading.Event | None
) -> tuple[DatasetCheck | None, str]:
    try:
        return prepare_for_draft(draft, progress=progress, cancel=cancel), ""
    except (OSError, PrepareError) as exc:
        _log.warning("could not prepare %s again: %s", draft.data_file, exc)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, f"The data could not be prepared again ({reason}); go back to the Data step to check it."
