"""The cost tracker: a menu-bar (tray) icon with the spend and a Stop per billing machine, notices, and closing.

The tray menu shows spend today and this month and a Stop for each machine billing now; notices come as tray
notifications; closing the window while something runs or bills keeps Rentune in the tray.

Where the desktop has no tray (offscreen, bare X servers, some Linux desktops), the same meter sits in the status
bar (:class:`StatusMeter`) and notices appear there. Everything the tray shows comes from :func:`menu_model`, so the
tray, the status bar and the tests see the same entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMenu,
    QSystemTrayIcon,
    QToolButton,
    QWidget,
)

from desktop.core.runs.states import TERMINAL
from desktop.services.billing.ledger import LedgerError
from desktop.services.billing.meter import BillingMachine, MeterReading, read_meter
from desktop.services.billing.notices import Notice
from desktop.services.platform.secrets import SecretStoreError
from desktop.services.providers.base import ProviderError
from desktop.services.renting.orphans import MachineInUseError, terminate_machine
from desktop.services.runs.errors import RunError
from desktop.services.runs.store import RunRecord
from desktop.ui.app_words import app_sentence
from desktop.ui.background import spawn
from desktop.ui.context import AppContext
from desktop.ui.cost_words import (
    burn_line,
    keeps_running_lines,
    machine_name,
    money,
    notice_words,
    provider_label,
    quit_question,
    rate,
    short_run,
    spend_line,
    stop_action_text,
    tray_place,
    upper_first,
)
from desktop.ui.design.icons import tint
from desktop.ui.meter import CostMeter
from desktop.ui.widgets.dialogs import confirm

#: Milliseconds a notification stays up.
NOTICE_MS = 12_000
#: The one-time explanation given when closing the window leaves Rentune in the tray.
EXPLAINED_KEY = "explained:close-to-tray"

_TRAY_ICONS = {
    "danger": QSystemTrayIcon.MessageIcon.Critical,
    "warning": QSystemTrayIcon.MessageIcon.Warning,
}


@dataclass(frozen=True)
class MenuItem:
    """One entry of the cost menu.

    Attributes:
        kind: ``info`` (a line to read), ``separator``, ``stop`` (a machine's Stop), ``open`` (Open Rentune),
            ``costs`` (the Costs page) or ``quit``.
        text: What the entry says.
        machine: The machine a ``stop`` entry stops.
    """

    kind: str
    text: str = ""
    machine: BillingMachine | None = None

    @property
    def key(self) -> str:
        """What makes it the same entry from one reading to the next."""
        return (
            f"{self.kind}:{self.machine.key}"
            if self.machine
            else f"{self.kind}:{self.text if self.kind == 'separator' else ''}"
        )


def menu_model(reading: MeterReading | None, *, in_window: bool = False) -> list[MenuItem]:
    """The entries of the cost menu for ``reading`` (None: not read yet).

    Args:
        reading: What is spent and what bills.
        in_window: For the status bar's menu: no "Open Rentune" (the window is open) and no Quit.
    """
    items = []
    if reading is None:
        items.append(MenuItem("info", "Reading what was spent…"))
    else:
        items += [MenuItem("info", spend_line(reading)), MenuItem("info", burn_line(reading))]
        if reading.machines:
            items.append(MenuItem("separator", "machines"))
            items += [MenuItem("stop", stop_action_text(machine), machine) for machine in reading.machines]
    items.append(MenuItem("separator", "pages"))
    if not in_window:
        items.append(MenuItem("open", "Open Rentune"))
    items.append(MenuItem("costs", "Show costs"))
    if not in_window:
        items += [MenuItem("separator", "quit"), MenuItem("quit", "Quit Rentune")]
    return items


class CostMenu(QMenu):
    """The cost menu: spend lines, a Stop per billing machine, Open, Costs and Quit.

    Entries whose kind and machine stay the same keep their actions (only their words change), so the menu can stay
    open while the meter refreshes.

    Signals:
        sig_stop: A machine (:class:`BillingMachine`) to stop.
        sig_open: Open Rentune's window.
        sig_costs: Show the Costs page.
        sig_quit: Quit Rentune.
    """

    sig_stop = Signal(object)
    sig_open = Signal()
    sig_costs = Signal()
    sig_quit = Signal()

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(title, parent)
        self.setAccessibleName(title)
        self.items: list[MenuItem] = []
        self._keys: list[str] = []

    def show_items(self, items: list[MenuItem]) -> None:
        """Shows ``items``: rewording the actions when the entries are the same, rebuilding them otherwise."""
        keys = [item.key for item in items]
        if keys == self._keys:
            for action, item in zip(self.actions(), items, strict=True):
                action.setText(item.text)
                action.setData(item)
        else:
            self.clear()
            for item in items:
                self._add(item)
            self._keys = keys
        self.items = items

    def _add(self, item: MenuItem) -> None:
        if item.kind == "separator":
            self.addSeparator()
            return
        action = QAction(item.text, self)
        action.setData(item)
        if item.kind == "info":
            action.setEnabled(False)
        elif item.kind == "stop":
            tint(action, "circle-stop")
        action.triggered.connect(lambda _checked=False, a=action: self._on_triggered(a))
        self.addAction(action)

    def _on_triggered(self, action: QAction) -> None:
        item = action.data()
        if not isinstance(item, MenuItem):
            return
        if item.kind == "stop":
            self.sig_stop.emit(item.machine)
        elif item.kind == "open":
            self.sig_open.emit()
        elif item.kind == "costs":
            self.sig_costs.emit()
        elif item.kind == "quit":
            self.sig_quit.emit()

    def action_for(self, kind: str, machine_key: str | None = None) -> QAction | None:
        """The action of the first entry of ``kind`` (and of that machine), for keyboard shortcuts and tests."""
        for action in self.actions():
            item = action.data()
            if not isinstance(item, MenuItem) or item.kind != kind:
                continue
            if machine_key is None or (item.machine is not None and item.machine.key == machine_key):
                return action
        return None


class CostTray(QObject):
    """The tray (menu-bar) icon, where the desktop has one: its menu, its tooltip with the burn, its notifications."""

    def __init__(self, window_icon: QIcon, parent: QObject | None = None, *, enabled: bool = True) -> None:
        super().__init__(parent)
        self.menu = CostMenu("Rentune costs")
        self.icon: QSystemTrayIcon | None = None
        if enabled and QSystemTrayIcon.isSystemTrayAvailable():
            self.icon = QSystemTrayIcon(window_icon, self)
            self.icon.setContextMenu(self.menu)
            self.icon.setToolTip("Rentune")
            self.icon.activated.connect(self.on_activated)
            self.icon.show()

    @property
    def available(self) -> bool:
        """Whether an icon is in the tray."""
        return self.icon is not None

    def show_reading(self, reading: MeterReading) -> None:
        """Updates the menu and the tooltip."""
        self.menu.show_items(menu_model(reading))
        if self.icon is not None:
            self.icon.setToolTip(f"Rentune: {burn_line(reading).lower()}\n{spend_line(reading)}")

    def notify(self, title: str, text: str, severity: str) -> bool:
        """Shows a notification from the tray; False when there is no tray."""
        if self.icon is None:
            return False
        kind = _TRAY_ICONS.get(severity, QSystemTrayIcon.MessageIcon.Information)
        self.icon.showMessage(title, text, kind, NOTICE_MS)
        return True

    def on_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        """A click on the icon (outside macOS, where a click opens the menu) opens the window."""
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.menu.sig_open.emit()

    def hide(self) -> None:
        """Takes the icon out of the tray (the app is quitting)."""
        if self.icon is not None:
            self.icon.hide()


class StatusMeter(QWidget):
    """The meter in the status bar, where there is no tray: today, this month, the burn, and a Stop menu."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Spending")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(8)
        self.label = QLabel("Reading what was spent…")
        self.label.setAccessibleName("Spending today, this month and now")
        self.menu = CostMenu("Machines billing now", self)
        self.button = QToolButton()
        self.button.setText("Stop…")
        tint(self.button, "circle-stop")
        self.button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.button.setMenu(self.menu)
        self.button.setAccessibleName("Stop a machine that bills")
        self.button.setStyleSheet("QToolButton { padding: 2px 18px 2px 8px; min-height: 16px; }")  # status-bar size
        self.button.setEnabled(False)
        row.addWidget(self.label)
        row.addWidget(self.button)

    def show_reading(self, reading: MeterReading) -> None:
        """Shows the sums and offers a Stop per billing machine."""
        overview = reading.overview
        now = f" · {rate(reading.burn_per_hour)} now" if reading.machines else ""
        self.label.setText(f"Today {money(overview.today_usd)} · Month {money(overview.month_usd)}{now}")
        self.menu.show_items(menu_model(reading, in_window=True))
        self.button.setEnabled(bool(reading.machines))
        self.button.setToolTip(burn_line(reading))


def ask_quit(parent: QWidget | None, lines: list[str]) -> bool:
    """Asks whether to quit although runs go on or machines bill (naming them); True to quit."""
    headline, details = quit_question(lines)
    return confirm(parent, headline, details, "&Quit anyway", "&Keep Rentune open", destructive=True)


def stop_question(machine: BillingMachine) -> tuple[str, str]:
    """The question asked before a Stop: its title and its words."""
    name = f"{machine_name(machine)} ({rate(machine.rate_per_hour)}, {money(machine.usd)} so far)"
    one = machine.machines == 1
    machines, disks = ("the machine", "its disk") if one else (f"all {machine.machines} machines", "their disks")
    if not machine.owned:
        return "Terminate machine", (
            f"Terminate {name}? No Rentune run uses it. {upper_first(machines)} and {disks} are deleted at "
            f"{provider_label(machine.provider)}."
        )
    after = f"{machines} {'is' if one else 'are'} terminated" if machine.rented else "your server stays as it is"
    return "Stop run", (
        f"Stop {short_run(machine.run_id)} on {name}? The trainer saves a checkpoint, which comes home; then {after} "
        "and the run ends as cancelled."
    )


class CostTracker(QObject):
    """The cost tracker of the main window: the meter, the tray (or the status-bar meter), notices, Stop and Quit.

    It also decides whether closing the window quits.

    Args:
        window: The main window.
        context: The app's services.
        open_page: Shows a page of the window by name (``costs``).
        status_line: Writes a line in the window's status bar (where there is no tray); default: a passing message.
    """

    def __init__(
        self,
        window: QMainWindow,
        context: AppContext,
        open_page: Callable[[str], None],
        status_line: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(window)
        self.window, self.context, self.open_page = window, context, open_page
        self.status_line = status_line or (lambda text: window.statusBar().showMessage(text, NOTICE_MS))
        self.meter = CostMeter(context.store, window, notices=not context.read_only)
        self.tray = CostTray(window.windowIcon(), self, enabled=not context.read_only)
        self.status_meter = StatusMeter()
        self.guard_close = False
        self.quitting = False
        self.said: list[tuple[str, str, str]] = []
        self._failures: set[str] = set()
        self._wire()

    def _wire(self) -> None:
        meter, menus = self.meter, [self.status_meter.menu]
        if self.tray.available:
            menus.append(self.tray.menu)
            meter.sig_updated.connect(self.tray.show_reading)
        else:
            self.window.statusBar().addPermanentWidget(self.status_meter)
            meter.sig_updated.connect(self.status_meter.show_reading)
        for menu in menus:
            menu.sig_stop.connect(self.on_stop_requested)
            menu.sig_open.connect(self.on_open)
            menu.sig_costs.connect(self.on_show_costs)
            menu.sig_quit.connect(self.on_quit)
        meter.sig_notice.connect(self.on_notice)
        quit_action = QAction("Quit Rentune", self.window)
        quit_action.setShortcut(QKeySequence("Ctrl+Q"))  # Cmd+Q on macOS; asks first, like the tray's Quit
        quit_action.triggered.connect(self.on_quit)
        self.window.addAction(quit_action)
        meter.sig_failed.connect(self.on_read_failed)

    @property
    def has_tray(self) -> bool:
        """Whether the tracker lives in a tray icon (else in the status bar)."""
        return self.tray.available

    def start(self) -> None:
        """Starts the meter."""
        self.meter.start()

    def stop(self) -> None:
        """Stops the meter and takes the icon out of the tray (the app is ending)."""
        self.meter.stop()
        self.tray.hide()

    # -- telling ----------------------------------------------------------------------------------------------------

    def say(self, title: str, text: str, severity: str = "info") -> None:
        """Tells the user: a tray notification, or the status bar where there is no tray."""
        text = app_sentence(text)
        self.said.append((title, text, severity))
        if self.tray.notify(title, text, severity):
            return
        self.status_line(f"{title}: {text}")

    def on_read_failed(self, words: str) -> None:
        """Says once (not at every read) that the costs cannot be read, and why."""
        if words not in self._failures:
            self._failures.add(words)
            self.say("Costs cannot be read", words, "danger")

    def on_notice(self, notice: Notice) -> None:
        """Gives a notice, unless notifications are off in Settings."""
        if self.context.settings.notifications:
            self.say(*notice_words(notice))

    # -- stopping ---------------------------------------------------------------------------------------------------

    def on_stop_requested(self, machine: BillingMachine) -> None:
        """Asks, then stops the machine's run (or terminates a machine no run uses) in the background."""
        title, question = stop_question(machine)
        action = "&Stop the run" if machine.owned else "&Terminate it"
        if confirm(self.window, title, question, action, "&Keep it"):
            spawn(self.stop_machine(machine))

    async def stop_machine(self, machine: BillingMachine) -> None:
        """Stops a billing machine: its run through the run manager, or, for one no run uses, at its provider."""
        try:
            if machine.owned and machine.run_id is not None:
                record = await self.context.manager.stop(machine.run_id)
                self._say_stopped(record)
            else:
                await terminate_machine(self.context.store, machine, self.context.secrets)
                self.meter.forget_orphan(machine.provider, machine.instance_id)
                self.say("Machine terminated", f"{machine_name(machine)} no longer bills.", "success")
        except (RunError, ProviderError, SecretStoreError, MachineInUseError, OSError) as exc:
            self.say(f"Could not stop {machine_name(machine)}", str(exc), "danger")
        self.meter.refresh(again=True)

    def _say_stopped(self, record: RunRecord) -> None:
        run = upper_first(short_run(record.id))
        if record.state in TERMINAL:
            self.say("Run stopped", f"{run} is {record.state.value}.", "success")
        else:  # another process (a rentune command) follows the run: it pulls the checkpoint and ends it
            self.say("Stop requested", f"{run} ends once its trainer has saved a checkpoint.", "info")

    # -- opening, closing, quitting ---------------------------------------------------------------------------------

    def on_open(self) -> None:
        """Brings the window back (from the tray, or minimised)."""
        self.window.showNormal()
        self.window.raise_()
        self.window.activateWindow()

    def on_show_costs(self) -> None:
        """Brings the window back on the Costs page."""
        self.on_open()
        self.open_page("costs")

    def keeps_open(self, event: QCloseEvent) -> bool:
        """Decides a window close: True when the app stays (window hidden to the tray, or the user chose to stay).

        Only once :attr:`guard_close` is on (the running app; tests and screenshots close plainly). With nothing
        running or billing, closing quits.
        """
        if not self.guard_close or self.quitting:
            return False
        lines = self.keeps_running()
        if not lines:
            return False
        event.ignore()
        if self.has_tray:
            self.window.hide()
            if self.meter.first_time(EXPLAINED_KEY):
                self.say(
                    "Rentune is still running",
                    f"It stays in {tray_place()} while training runs or machines bill. Quit from its menu.",
                )
            return True
        if ask_quit(self.window, lines):
            self.quitting = True
            event.accept()
            return False
        return True

    def keeps_running(self) -> list[str]:
        """What would go on after quitting (a fresh read: the question must be right)."""
        reading: MeterReading | None
        try:
            reading = read_meter(self.context.store, orphans=self.meter.orphans)
        except (LedgerError, OSError):
            reading = self.meter.latest
        return keeps_running_lines(reading) if reading is not None else []

    def on_quit(self) -> None:
        """Quits after asking, when runs go on or machines bill."""
        lines = self.keeps_running()
        if lines and not ask_quit(self.window if self.window.isVisible() else None, lines):
            return
        self.quitting = True
        self.tray.hide()
        self.window.close()
