"""What is worth a notification, said once: budget thresholds, idle machines, orphans, runs that finished or failed.

:func:`due_notices` lists what is true of a :class:`~desktop.services.billing.meter.MeterReading` now;
:class:`NoticeMemory` remembers what was said (in ``notices.json`` in the data folder) and passes on only the new.
The first time a profile is read, runs that had already ended are remembered without a word.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from desktop.core.runs.progress import ENDED
from desktop.core.runs.states import RunState
from desktop.services.billing.meter import MeterReading
from desktop.services.billing.records import RunRow
from desktop.services.billing.rentals import compute_of
from desktop.services.platform.files import atomic_write_text

#: Percentages of a run's budget that are announced (each once).
BUDGET_THRESHOLDS = (50, 80, 100)
#: Minutes without training progress after which a billing run is announced as idle.
IDLE_NOTICE_MINUTES = 10.0
#: Keys kept in the memory (the oldest are forgotten first).
MEMORY_LIMIT = 5000


class NoticeKind(StrEnum):
    """What a notice is about."""

    BUDGET = "budget"
    IDLE = "idle"
    ORPHANS = "orphans"
    FINISHED = "finished"
    FAILED = "failed"
    BUDGET_STOPPED = "budget_stopped"


#: Kinds about a run that has ended (remembered silently the first time a profile is read).
ENDING_KINDS = frozenset({NoticeKind.FINISHED, NoticeKind.FAILED, NoticeKind.BUDGET_STOPPED})


@dataclass(frozen=True)
class Notice:
    """Something to tell the user once.

    Attributes:
        kind: What it is about.
        key: What makes it the same notice next time (remembered once said).
        run_id: The run it is about (None for orphans).
        percent: The budget threshold crossed.
        usd: Dollars spent by the run (budget), or dollars per hour the orphans bill.
        budget_usd: The run's budget.
        minutes: Minutes without progress (idle).
        guard_minutes: Minutes after which the idle guard terminates the machine (0: no guard).
        count: Machines (orphans).
        model: The run's base model.
        detail: A failed run's error.
    """

    kind: NoticeKind
    key: str
    run_id: str | None = None
    percent: int = 0
    usd: float = 0.0
    budget_usd: float = 0.0
    minutes: float = 0.0
    guard_minutes: float = 0.0
    count: int = 0
    model: str = ""
    detail: str = ""


def _model(record: RunRow | None) -> str:
    return str(record.spec.get("base_model") or "") if record is not None else ""


def budget_notices(reading: MeterReading) -> list[Notice]:
    """Each budget threshold a run that has not ended has crossed."""
    notices = []
    for cost in reading.overview.runs:
        record = cost.record
        budget = float(record.spec.get("budget_usd") or 0.0) if record is not None else 0.0
        if record is None or budget <= 0 or record.state in ENDED:
            continue
        for percent in BUDGET_THRESHOLDS:
            if cost.spend.usd >= budget * percent / 100:
                key = f"budget:{record.id}:{percent}"
                notices.append(
                    Notice(NoticeKind.BUDGET, key, record.id, percent, cost.spend.usd, budget, model=_model(record))
                )
    return notices


def idle_notices(reading: MeterReading, notice_minutes: float = IDLE_NOTICE_MINUTES) -> list[Notice]:
    """Each live run whose machine bills yet trained nothing for ``notice_minutes`` (or half its idle guard)."""
    billing = {machine.run_id for machine in reading.machines if machine.owned}
    notices = []
    for record in reading.live:
        last = reading.last_progress.get(record.id)
        if record.id not in billing or last is None:
            continue
        compute = compute_of(record)
        guard = compute.idle_minutes if compute is not None else 0.0
        after = min(notice_minutes, guard / 2) if guard > 0 else notice_minutes
        idle = (reading.now - last) / 60
        if idle >= after:
            key = f"idle:{record.id}:{last:.0f}"
            notices.append(Notice(NoticeKind.IDLE, key, record.id, minutes=idle, guard_minutes=guard))
    return notices


def orphan_notices(reading: MeterReading) -> list[Notice]:
    """One notice for the machines that bill with no live run to use them (a new one when the set changes)."""
    orphans = [machine for machine in reading.machines if not machine.owned]
    if not orphans:
        return []
    key = "orphans:" + ",".join(sorted(machine.key for machine in orphans))
    burn = sum(machine.rate_per_hour for machine in orphans)
    return [Notice(NoticeKind.ORPHANS, key, usd=burn, count=len(orphans))]


def ending_notices(records: Iterable[RunRow]) -> list[Notice]:
    """Each run that finished, failed, or was stopped at its budget."""
    notices = []
    for record in records:
        model = _model(record)
        if record.state is RunState.FINISHED and not record.spec.get("trial"):  # a trial shows its end itself
            notices.append(Notice(NoticeKind.FINISHED, f"finished:{record.id}", record.id, model=model))
        elif record.state is RunState.FAILED:
            key = f"failed:{record.id}:{record.error or ''}"
            notices.append(Notice(NoticeKind.FAILED, key, record.id, model=model, detail=record.error or ""))
        elif record.state is RunState.CANCELLED and record.spec.get("budget_stop"):
            budget = float(record.spec.get("budget_usd") or 0.0)
            key = f"budget_stopped:{record.id}"
            notices.append(Notice(NoticeKind.BUDGET_STOPPED, key, record.id, budget_usd=budget, model=model))
    return notices


def due_notices(reading: MeterReading, notice_minutes: float = IDLE_NOTICE_MINUTES) -> list[Notice]:
    """Everything worth saying about ``reading``, said or not."""
    return [
        *budget_notices(reading),
        *idle_notices(reading, notice_minutes),
        *orphan_notices(reading),
        *ending_notices(reading.records),
    ]


class NoticeMemory:
    """Remembers which notices were given, so each is given once (across restarts when it has a file).

    Args:
        path: The JSON file to keep the memory in; None keeps it in memory only (screenshots, read-only renders).

    Thread-safe: the app reads in a worker thread and asks :meth:`first_time` on the UI thread.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._keys: dict[str, None] = {}
        self._fresh_profile = True
        self._loaded = path is None

    def _load(self) -> None:
        """Reads the memory file the first time it is needed (under the lock)."""
        if self._loaded or self.path is None:
            return
        self._loaded = True
        path = self.path
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # no memory yet (or an unreadable one): start over, saying nothing about runs already ended
        keys = data.get("said") if isinstance(data, dict) else None
        if isinstance(keys, list):
            self._keys = dict.fromkeys(str(key) for key in keys)
            self._fresh_profile = False

    def take(self, notices: Sequence[Notice]) -> list[Notice]:
        """The notices not given before (per run only the highest budget threshold); all are remembered.

        The first time (no memory file yet), notices about runs that had already ended are remembered silently.
        """
        with self._lock:
            self._load()
            fresh = [notice for notice in notices if notice.key not in self._keys]
            if self._fresh_profile:
                fresh = [notice for notice in fresh if notice.kind not in ENDING_KINDS]
            self._fresh_profile = False
            changed = any(notice.key not in self._keys for notice in notices)
            for notice in notices:
                self._keys[notice.key] = None
            if changed:
                self._save()
        return _highest_budget_only(fresh)

    def first_time(self, key: str) -> bool:
        """Whether ``key`` is new (it is remembered from now on): for one-time explanations."""
        with self._lock:
            self._load()
            if key in self._keys:
                return False
            self._keys[key] = None
            self._save()
            return True

    def _save(self) -> None:
        while len(self._keys) > MEMORY_LIMIT:
            del self._keys[next(iter(self._keys))]
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps({"said": list(self._keys)}, indent=0) + "\n")
        except OSError:
            return  # a memory that cannot be written repeats a notice after a restart; never worth failing over


def _highest_budget_only(notices: list[Notice]) -> list[Notice]:
    highest: dict[str, int] = {}
    for notice in notices:
        if notice.kind is NoticeKind.BUDGET and notice.run_id is not None:
            highest[notice.run_id] = max(highest.get(notice.run_id, 0), notice.percent)
    return [
        notice
        for notice in notices
        if notice.kind is not NoticeKind.BUDGET or notice.run_id is None or notice.percent == highest[notice.run_id]
    ]
