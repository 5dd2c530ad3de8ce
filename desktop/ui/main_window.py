"""The main window: a sidebar of pages, the page stack, and a status bar."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, cast

from PySide6.QtCore import QByteArray, QSignalBlocker, QSize, Signal
from PySide6.QtGui import QCloseEvent, QIcon, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QStackedWidget,
    QWidget,
)

from desktop import __version__
from desktop.core.settings import Settings
from desktop.services.platform.resources import ResourceNotFoundError, resource_bytes
from desktop.services.platform.secrets import SecretStore
from desktop.ui.app_words import app_sentence
from desktop.ui.background import spawn
from desktop.ui.context import AppContext
from desktop.ui.cost_words import upper_first
from desktop.ui.design.icons import icon
from desktop.ui.keyboard import make_tab_friendly
from desktop.ui.pages.base import BasePage
from desktop.ui.pages.catalog import PAGES, WIZARD_STEPS, PageEntry, page_names, warm_up
from desktop.ui.pages.home_page import HomePage
from desktop.ui.status import RunningStatus
from desktop.ui.theme import theme_events
from desktop.ui.tray import CostTracker
from desktop.ui.widgets.bucket_cost_card import BucketCostCard
from desktop.ui.widgets.dialogs import ConfirmDialog, TextDialog
from desktop.ui.widgets.elided_label import ElidedLabel
from desktop.ui.widgets.orphans_banner import OrphansBanner

if TYPE_CHECKING:
    from desktop.ui.design.palette import Palette
    from desktop.ui.pages.chat_page import ChatPage
    from desktop.ui.pages.costs_page import CostsPage
    from desktop.ui.pages.models_page import ModelsPage
    from desktop.ui.pages.monitor_page import MonitorPage
    from desktop.ui.pages.runs_page import RunsPage
    from desktop.ui.pages.wizard.wizard_page import WizardPage
    from desktop.ui.widgets.rent_or_buy_card import RentOrBuyCard


#: Seconds between two tries at rentals not yet settled (a machine whose terminate is not confirmed).
SETTLE_RETRY_S = 60.0
#: Seconds between two looks when everything was settled (another process may leave some).
SETTLE_IDLE_S = 300.0


#: Room beside the sidebar's longest label, so that it never touches the edge.
SIDEBAR_SPARE_PX = 12


class UnknownPageError(KeyError):
    """A page name that the main window does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


def app_icon() -> QIcon:
    """Returns Rentune's icon, or an empty icon if the resource is missing (the window still works)."""
    try:
        data = resource_bytes("icons", "rentune.svg")
    except ResourceNotFoundError:
        return QIcon()
    pixmap = QPixmap()
    pixmap.loadFromData(QByteArray(data), "SVG")
    return QIcon(pixmap)


class MainWindow(QMainWindow):
    """Rentune's main window.

    The sidebar lists the pages of :data:`~desktop.ui.pages.catalog.PAGES`. Only the Home page is built before the
    window first shows (so it opens fast); every other page is built the first time it is asked for, and
    :meth:`load_pages` builds and loads them all in the background once the window is up.
    """

    sig_page_changed = Signal(str)
    sig_closed = Signal()

    def __init__(self, settings: Settings, secrets: SecretStore, context: AppContext | None = None) -> None:
        super().__init__()
        self.setWindowTitle(f"Rentune {__version__}")
        self.setWindowIcon(app_icon())
        self.setObjectName("main_window")
        self.setAccessibleName("Rentune")
        self.resize(1280, 800)
        self._settling: asyncio.Task[None] | None = None
        self.setMinimumSize(QSize(900, 600))
        self.settings, self.secrets = settings, secrets
        self.context = context or AppContext(settings, secrets)
        self._entries = {entry.name: entry for entry in PAGES}
        self._pages: dict[str, BasePage] = {}
        self._loading: dict[str, asyncio.Task[None]] | None = None  # page loads, once load_pages has begun
        self._sidebar_pages = [entry.name for entry in PAGES if entry.in_sidebar]
        self._build_layout()
        self.orphans_banner = OrphansBanner(self.context.store, secrets)
        self.orphans_banner.sig_stopped.connect(self.on_orphans_stopped)
        self.sidebar.setCurrentRow(0)
        self.status_label = ElidedLabel("Ready. No machine is rented.")
        self.status_label.setAccessibleName("What is running")
        self.statusBar().addWidget(self.status_label, 1)
        self.status_label.sig_clicked.connect(self.on_status_clicked)
        self.status_dialog: TextDialog | None = None
        self.overrun_dialog: ConfirmDialog | None = None
        self.context.manager.ask_overrun = self.ask_overrun
        self.cost_tracker = CostTracker(self, self.context, self.show_page, self.status_label.setText)
        self.running_status = RunningStatus(self.cost_tracker.meter, self.status_label, self)

    # -- building pages on demand ------------------------------------------------------------------------------

    def _build_home(self) -> BasePage:
        home = HomePage(
            banner=self.orphans_banner, draft=self.context.draft, secrets=self.secrets, store=self.context.store
        )
        home.sig_start_wizard.connect(self.on_start_wizard)
        home.sig_open_page.connect(self.show_page)
        home.sig_open_run.connect(self.on_run_opened)
        home.sig_start_over.connect(self.on_start_over)
        return home

    def _build_wizard(self) -> BasePage:
        from desktop.ui.pages.wizard.review_step import ReviewStep
        from desktop.ui.pages.wizard.steps import wizard_steps
        from desktop.ui.pages.wizard.wizard_page import WizardPage

        wizard = WizardPage(self.context, wizard_steps(self.context))
        wizard.sig_run_launched.connect(self.on_run_opened)
        review = wizard.step("review")
        assert isinstance(review, ReviewStep)
        review.sig_edit.connect(wizard.show_step)
        review.sig_launched.connect(wizard.sig_run_launched)
        return wizard

    def _build_runs(self) -> BasePage:
        from desktop.ui.pages.runs_page import RunsPage

        runs = RunsPage(self.context)
        runs.sig_open_run.connect(self.on_run_opened)
        runs.sig_new_run.connect(lambda: self.show_page("new"))
        return runs

    def _build_models(self) -> BasePage:
        from desktop.ui.pages.models_page import ModelsPage

        page = ModelsPage(self.context)
        page.sig_new_run.connect(lambda: self.show_page("new"))
        page.sig_chat.connect(self.on_chat_requested)
        return page

    def _build_chat(self) -> BasePage:
        from desktop.ui.pages.chat_page import ChatPage

        page = ChatPage(self.context)
        page.sig_install_tools.connect(self.on_install_tools_requested)
        return page

    def _build_costs(self) -> BasePage:
        from desktop.services.runs.bill import BillEvents, month_idle
        from desktop.ui.pages.costs_page import CostsPage

        events = BillEvents()
        page = CostsPage(
            idle=lambda: month_idle(self.context.store, events),
            rent_or_buy=self._rent_or_buy_card(),
            bucket=BucketCostCard(self.secrets),
        )
        page.follow(self.cost_tracker.meter)
        page.sig_stop.connect(self.cost_tracker.on_stop_requested)
        return page

    def _rent_or_buy_card(self) -> RentOrBuyCard:
        from desktop.services.models.configs import load_gpus
        from desktop.services.platform.settings import update_settings
        from desktop.services.runs.bill import BillEvents
        from desktop.services.runs.rent_or_buy import rent_or_buy
        from desktop.ui.widgets.rent_or_buy_card import RentOrBuyCard

        events = BillEvents()  # its own: the month's idle is read on another thread
        card = RentOrBuyCard(
            lambda choice: rent_or_buy(choice, self.context.store, events=events),
            lambda choice: update_settings({"rent_or_buy": choice.model_dump()}),
            self.settings.rent_or_buy,
        )
        card.fill_rent_choices([(gpu.id, gpu.name) for gpu in load_gpus()])
        return card

    def _build_settings(self) -> BasePage:
        from desktop.ui.pages.settings_page import SettingsPage

        page = SettingsPage(self.settings, self.secrets)
        page.sig_settings_changed.connect(self.on_settings_changed)
        return page

    def _build_monitor(self) -> BasePage:
        from desktop.ui.pages.monitor_page import MonitorPage

        page = MonitorPage(self.context)
        page.sig_open_models.connect(self.on_models_requested)
        page.follow(self.cost_tracker.meter)
        return page

    def _build(self, entry: PageEntry) -> BasePage:
        page: BasePage = getattr(self, f"_build_{entry.builder}")()
        make_tab_friendly(page)
        self._pages[entry.name] = page
        self.stack.insertWidget(self._stack_index(entry.name), page)
        if self._loading is not None:
            self._loading[entry.name] = spawn(page.load())
        return page

    def _stack_index(self, name: str) -> int:
        """Where a new page goes in the stack: after the built pages that come before it in the catalog."""
        order = [entry.name for entry in PAGES]
        return sum(1 for built in self._pages if order.index(built) < order.index(name))

    def _built(self, name: str) -> BasePage:
        return self._pages.get(name) or self._build(self._entries[name])

    @property
    def wizard(self) -> WizardPage:
        """The New fine-tune page (built when first asked for)."""
        return cast("WizardPage", self._built("new"))

    @property
    def runs_page(self) -> RunsPage:
        """The Runs page (built when first asked for)."""
        return cast("RunsPage", self._built("runs"))

    @property
    def costs_page(self) -> CostsPage:
        """The Costs page (built when first asked for)."""
        return cast("CostsPage", self._built("costs"))

    @property
    def monitor(self) -> MonitorPage:
        """The run monitor (built when first asked for)."""
        return cast("MonitorPage", self._built("monitor"))

    def _build_layout(self) -> None:
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.sidebar = QListWidget()
        self.sidebar.setObjectName("sidebar")
        self.sidebar.setAccessibleName("Sections")
        self.sidebar.setIconSize(QSize(18, 18))
        self.sidebar.ensurePolished()  # item heights are measured with the stylesheet's padding, not before it
        for entry in PAGES:
            if entry.in_sidebar:
                QListWidgetItem(icon(entry.icon), entry.label, self.sidebar)
        # As wide as its longest label needs (at any font size), not more: at 1024 px the pages need every pixel.
        frame = 2 * self.sidebar.frameWidth()
        self.sidebar.setFixedWidth(self.sidebar.sizeHintForColumn(0) + frame + SIDEBAR_SPARE_PX)
        theme_events().sig_changed.connect(self.on_theme_changed)
        self.stack = QStackedWidget()
        layout.addWidget(self.sidebar)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self.sidebar.currentRowChanged.connect(self.on_sidebar_row_changed)
        # Clicking the current row (Runs, while the monitor shows) must still go there.
        self.sidebar.itemClicked.connect(lambda item: self.on_sidebar_row_changed(self.sidebar.row(item)))
        self.sidebar.itemActivated.connect(lambda item: self.on_sidebar_row_changed(self.sidebar.row(item)))

    def page_names(self) -> list[str]:
        """Returns the names usable with :meth:`show_page` and ``--page``: pages, then the wizard's steps."""
        return page_names()

    def page(self, name: str) -> BasePage:
        """Returns the page called ``name`` (a wizard step's name gives the wizard), building it if need be.

        Raises:
            UnknownPageError: No such page; the message lists the pages there are.
        """
        if name in WIZARD_STEPS:
            return self.wizard
        if name not in self._entries:
            raise UnknownPageError(f"no page named {name!r}; choose one of: {', '.join(self.page_names())}")
        return self._built(name)

    def show_page(self, name: str) -> None:
        """Switches to the page (or wizard step) called ``name`` (see :meth:`page`)."""
        page = self.page(name)
        if page is self._pages.get("new") and name != "new":
            self.wizard.show_step(name)
        if page is self._pages.get("monitor") and self.monitor.run_id is None:
            self._show_newest_run()
        if page.page_name in self._sidebar_pages:
            self.sidebar.setCurrentRow(self._sidebar_pages.index(page.page_name))
            self.stack.setCurrentWidget(page)
        else:
            with QSignalBlocker(self.sidebar):  # the monitor belongs under Runs: mark it, without switching there
                self.sidebar.setCurrentRow(self._sidebar_pages.index("runs"))
            self.stack.setCurrentWidget(page)
            self.sig_page_changed.emit(page.page_name)

    def on_start_wizard(self, step: str) -> None:
        """Opens the wizard at ``step`` (where the draft left off), or at its start if there is no such step."""
        self.show_page(step if step in WIZARD_STEPS else "new")

    def on_start_over(self) -> None:
        """A new fine-tune after a launch: the draft starts over (data and machine setup kept) at the Data step."""
        from desktop.ui.pages.wizard.review_step import ReviewStep

        wizard = cast("WizardPage", self._built("new"))
        review = wizard.step("review")
        assert isinstance(review, ReviewStep)
        review.on_start_over_clicked()
        self.show_page("new")

    def _show_newest_run(self) -> None:
        runs = self.context.store.all()
        if runs:
            self.monitor.show_run(max(runs, key=lambda record: record.started).id)

    def on_run_opened(self, run_id: str) -> None:
        """Opens the monitor on a run (just launched, or picked in the runs list)."""
        self.monitor.show_run(run_id)
        self.show_page("monitor")

    async def load_pages(self, *, follow_runs: bool = True) -> None:
        """Builds every page and lets each fetch what it shows.

        The pages' modules are imported in a worker thread first, and pages are built one per turn of the event
        loop, so the window stays responsive while the rest of the app comes up behind the first page.

        Args:
            follow_runs: Also reattach to the runs that were live when the app last closed (not for screenshots).
        """
        if follow_runs:
            self._reattach()
            spawn(self.check_orphans())
            self._settling = spawn(self.settle_rentals())
            if self.settings.check_for_updates:
                spawn(self.check_for_update())
        self.cost_tracker.start()
        self._loading = {name: spawn(page.load()) for name, page in self._pages.items()}
        await warm_up()
        for entry in PAGES:
            if entry.name not in self._pages:
                self._build(entry)
                await asyncio.sleep(0)
        await asyncio.gather(*self._loading.values())

    def _reattach(self) -> None:
        reattached = self.context.manager.reattach_all()
        if reattached:
            self.status_label.setText(
                f"Reattached to {len(reattached)} live run(s); their checkpoints keep coming home."
            )

    def on_install_tools_requested(self) -> None:
        """Installs the local tools on the Models page, where their progress and size are shown."""
        models = cast("ModelsPage", self._built("models"))
        self.show_page("models")
        models.on_install_tools()

    def on_models_requested(self, adapter: str) -> None:
        """Opens the Models page with the adapter or checkpoint at ``adapter`` selected, to export or chat."""
        models = cast("ModelsPage", self._built("models"))
        self.show_page("models")
        models.select_when_listed(Path(adapter))

    async def ask_overrun(self, run_id: str, words: str) -> bool:
        """Asks whether a run whose first measured steps overrun goes on (its trainer waits paused); True to go on.

        The tray (or the status bar) tells at once; the question is a window of the app's own, Stop its safe answer.
        """
        said = app_sentence(words)
        self.cost_tracker.say("A run is over its estimate", f"Run {run_id}: {said}", "warning")
        question = (
            f"Run {run_id}: {said}\n\nIts trainer is paused while you decide, at most 10 minutes, and its machine "
            "bills meanwhile. Stop saves a checkpoint, brings it home and ends the run."
        )
        dialog = ConfirmDialog(self, "Go on with this run?", question, "&Go on", "&Stop with a checkpoint")
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def answered(code: int) -> None:
            if not answer.done():
                answer.set_result(code == QDialog.DialogCode.Accepted.value)

        dialog.finished.connect(answered)
        self.overrun_dialog = dialog
        dialog.open()
        try:
            return await answer
        finally:
            dialog.close()  # asked no longer (answered, or the machine's wait ran out)

    def on_status_clicked(self) -> None:
        """Shows the status line whole (it was cut short), to read and copy."""
        self.status_dialog = TextDialog(self, "Status", self.status_label.text())
        self.status_dialog.open()

    def on_chat_requested(self, model: str, lora: str) -> None:
        """Opens the chat on a model picked on the Models page."""
        chat = cast("ChatPage", self._built("chat"))
        chat.open_model(model, lora)
        self.show_page("chat")

    async def check_for_update(self) -> None:
        """Says in the status bar when a newer Rentune is released (the user turned the check on in Settings)."""
        from desktop.services.platform.updates import UpdateCheckError, check_for_update

        try:
            found = await check_for_update()
        except UpdateCheckError as exc:
            self.status_label.setText(f"Update check: {app_sentence(str(exc))}")
            return
        if found.newer:
            self.status_label.setText(found.words())

    def on_orphans_stopped(self, words: str) -> None:
        """Says in the status bar what terminating the orphans did."""
        self.status_label.setText(f"{words[0].upper()}{words[1:]}.")
        self.cost_tracker.meter.set_orphans(None)

    async def settle_rentals(self) -> None:
        """Settles rentals left ``creating`` or ``terminating`` now and then in the background, for the app's life.

        A machine whose terminate has not been confirmed is retried every minute until its provider says it is gone.
        """
        from desktop.services.renting.reconcile import settle_rentals

        while True:
            settled = await settle_rentals(self.context.store, self.context.secrets)
            if settled.lines:
                self.status_label.setText(f"{upper_first(settled.lines[0])}.")
            busy = settled.still_terminating or settled.busy or settled.notes
            await asyncio.sleep(SETTLE_RETRY_S if busy else SETTLE_IDLE_S)

    async def check_orphans(self) -> None:
        """Asks the providers with a key for machines no live run owns; the Home page warns of them."""
        from desktop.services.renting.orphans import find_orphans

        report = await find_orphans(self.context.store, self.context.secrets)
        if report is not None:
            self.orphans_banner.show_report(report)
            self.cost_tracker.meter.set_orphans(report)

    def on_sidebar_row_changed(self, row: int) -> None:
        """Shows the page picked in the sidebar (building it if it is not built yet)."""
        if row < 0:
            return
        name = self._sidebar_pages[row]
        self.stack.setCurrentWidget(self._built(name))
        self.sig_page_changed.emit(name)

    def on_theme_changed(self, palette: Palette) -> None:
        """Draws the sidebar's icons again in the new palette's text colour (the rest follow through ``tint``)."""
        entries = [entry for entry in PAGES if entry.in_sidebar]
        for row, entry in enumerate(entries):
            self.sidebar.item(row).setIcon(icon(entry.icon, palette.text))

    def on_settings_changed(self, settings: Settings) -> None:
        """Applies saved preferences that take effect at once (the Settings page applies a theme when it is chosen)."""
        self.context.apply_settings(settings)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Announces the close so the app's main coroutine can finish, unless the cost tracker keeps the app open.

        It does in the tray while something runs or bills, or when the user chose not to quit.
        """
        if self.cost_tracker.keeps_open(event):
            return
        self.cost_tracker.stop()
        if self._settling is not None:
            self._settling.cancel()
        self.sig_closed.emit()
        super().closeEvent(event)
