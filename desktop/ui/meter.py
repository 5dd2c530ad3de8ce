"""The app's cost meter: reads what is spent and what bills every few seconds, off the UI thread, and announces it.

One :class:`CostMeter` feeds the tray menu, the status bar and the Costs page from the same reading, so they never
disagree; it also passes on each notice (budget thresholds, idle or orphaned machines, finished or failed runs) once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QWidget

from desktop.services.billing.ledger import Ledger, LedgerError
from desktop.services.billing.meter import MeterReading, read_meter
from desktop.services.billing.notices import Notice, NoticeMemory, due_notices
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.providers.base import Instance
from desktop.services.renting.orphans import MachinesReport
from desktop.services.runs.store import RunStore
from desktop.ui.background import Job, Operation, Running

#: How often the meter reads (milliseconds).
REFRESH_MS = 3000
#: The file remembering which notices were given.
NOTICES_FILE = "notices.json"
_log = get_logger("ui")


class CostMeter(QObject):
    """Reads the spend and the billing machines on a timer, in the background; one read at a time.

    Args:
        store: The runs.
        owner: The widget the background reads belong to (the main window).
        notices: Whether to work out notices (off for read-only renders).
        memory: Where given notices are remembered (``notices.json`` in the data folder by default).

    Signals:
        sig_updated: A new :class:`~desktop.services.billing.meter.MeterReading`.
        sig_notice: A :class:`~desktop.services.billing.notices.Notice` not given before.
        sig_failed: The ledger could not be read (the message says which file and what to do).
    """

    sig_updated = Signal(object)
    sig_notice = Signal(object)
    sig_failed = Signal(str)

    def __init__(
        self, store: RunStore, owner: QWidget, *, notices: bool = True, memory: NoticeMemory | None = None
    ) -> None:
        super().__init__(owner)
        self.store, self.owner = store, owner
        self.latest: MeterReading | None = None
        self.orphans: tuple[Instance, ...] = ()
        self._notices = notices
        self.memory = memory or NoticeMemory(app_paths().data_dir / NOTICES_FILE if notices else None)
        self._ledger: Ledger | None = None
        self._running: Running[tuple[MeterReading, list[Notice]]] | None = None
        self._started = self._delivered = 0
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.on_tick)

    def start(self) -> None:
        """Reads now and then every few seconds."""
        self.timer.start()
        self.refresh()

    def stop(self) -> None:
        """Stops reading."""
        self.timer.stop()

    def on_tick(self) -> None:
        """Reads again, while the app's event loop runs (a tick during shutdown has nothing to read for)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self.refresh()

    def set_orphans(self, report: MachinesReport | None) -> None:
        """Takes the machines found at the providers that no live run owns (the check at start), and reads again."""
        self.orphans = tuple(machine.instance for machine in report.orphans) if report is not None else ()
        self.refresh(again=True)

    def forget_orphan(self, provider: str, instance_id: str) -> None:
        """Drops one orphan from the list (it was terminated)."""
        self.orphans = tuple(i for i in self.orphans if (i.provider.value, i.instance_id) != (provider, instance_id))

    def refresh(self, *, again: bool = False) -> Running[tuple[MeterReading, list[Notice]]]:
        """Starts a read (returns the one under way, unless ``again`` asks for a newer one after it)."""
        if self._running is not None and self._running.active and not again:
            return self._running
        orphans = self.orphans
        self._started += 1
        number = self._started
        running = Operation(self.owner, lambda job: self._read(job, orphans), lambda got: self._deliver(number, got))
        self._running = running.failure(self._failed, LedgerError, OSError).run()
        return self._running

    def _read(self, _job: Job, orphans: Sequence[Instance]) -> tuple[MeterReading, list[Notice]]:
        """The blocking read (a worker thread): the reading, and the notices not given before."""
        if self._ledger is None:
            self._ledger = Ledger()
        reading = read_meter(self.store, self._ledger, orphans)
        if not self._notices:
            return reading, []
        return reading, self.memory.take(due_notices(reading))

    def _deliver(self, number: int, result: tuple[MeterReading, list[Notice]]) -> None:
        reading, notices = result
        if number > self._delivered:  # an older read finishing late never replaces a newer one
            self._delivered = number
            self.latest = reading
            self.sig_updated.emit(reading)
        for notice in notices:
            self.sig_notice.emit(notice)

    def _failed(self, exc: Exception) -> None:
        _log.warning("the cost meter could not read: %s", exc)
        self.sig_failed.emit(str(exc))

    def first_time(self, key: str) -> bool:
        """Whether a one-time explanation (``key``) is due now; it is remembered as given."""
        return self.memory.first_time(key)
