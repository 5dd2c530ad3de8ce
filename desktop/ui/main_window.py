"""The main window: a sidebar of pages, the page stack, and a status bar."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QByteArray, QSignalBlocker, QSize, Signal
from PySide6.QtGui import QCloseEvent, QIcon, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QMainWindow, QStackedWidget, QWidget

from desktop import __version__
from desktop.core.settings import Settings
from desktop.services.platform.resources import ResourceNotFoundError, resource_bytes
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.orphans import find_orphans
from desktop.ui.background import spawn
from desktop.ui.context import AppContext
from desktop.ui.design.icons import icon
from desktop.ui.keyboard import make_tab_friendly
from desktop.ui.pages.base import BasePage
from desktop.ui.pages.chat_page import ChatPage
from desktop.ui.pages.home_page import HomePage
from desktop.ui.pages.models_page import ModelsPage
from desktop.ui.pages.monitor_page import MonitorPage
from desktop.ui.pages.runs_page import RunsPage
from desktop.ui.pages.settings_page import SettingsPage
from desktop.ui.pages.wizard.review_step import ReviewStep
from desktop.ui.pages.wizard.steps import wizard_steps
from desktop.ui.pages.wizard.wizard_page import WizardPage
from desktop.ui.status import RunningStatus
from desktop.ui.theme import apply_theme
from desktop.ui.widgets.orphans_banner import OrphansBanner


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

    Pages register by name; the sidebar lists them in order. Later pages (the wizard, runs, offers, costs, chat)
    slot in through :meth:`add_page`.
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
        self.setMinimumSize(QSize(900, 600))
        self.context = context or AppContext(settings, secrets)
        self._pages: dict[str, BasePage] = {}
        self._sidebar_pages: list[str] = []
        self._build_layout()
        self._add_pages(settings, secrets)
        make_tab_friendly(self)
        self.sidebar.setCurrentRow(0)
        self.status_label = QLabel("Ready. No machine is rented.")
        self.status_label.setAccessibleName("What is running")
        self.statusBar().addWidget(self.status_label, 1)
        self.running_status = RunningStatus(self.context, self.status_label, self)

    def _add_pages(self, settings: Settings, secrets: SecretStore) -> None:
        self.orphans_banner = OrphansBanner(self.context.store, secrets)
        self.orphans_banner.sig_stopped.connect(self.on_orphans_stopped)
        self.add_page(HomePage(banner=self.orphans_banner))
        self.wizard = WizardPage(self.context, wizard_steps(self.context))
        self.wizard.sig_run_launched.connect(self.on_run_opened)
        review = self.wizard.step("review")
        assert isinstance(review, ReviewStep)
        review.sig_edit.connect(self.wizard.show_step)
        review.sig_launched.connect(self.wizard.sig_run_launched)
        self.add_page(self.wizard)
        self.runs_page = RunsPage(self.context)
        self.runs_page.sig_open_run.connect(self.on_run_opened)
        self.runs_page.sig_new_run.connect(lambda: self.show_page("new"))
        self.add_page(self.runs_page)
        self.models_page, self.chat_page = ModelsPage(self.context), ChatPage(self.context)
        self.models_page.sig_new_run.connect(lambda: self.show_page("new"))
        self.models_page.sig_chat.connect(self.on_chat_requested)
        self.add_page(self.models_page)
        self.add_page(self.chat_page)
        settings_page = SettingsPage(settings, secrets)
        settings_page.sig_settings_changed.connect(self.on_settings_changed)
        self.add_page(settings_page)
        self.monitor = MonitorPage(self.context)
        self.add_page(self.monitor, in_sidebar=False)

    def _build_layout(self) -> None:
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.sidebar = QListWidget()
        self.sidebar.setObjectName("sidebar")
        self.sidebar.setAccessibleName("Sections")
        self.sidebar.setFixedWidth(200)
        self.sidebar.setIconSize(QSize(18, 18))
        self.stack = QStackedWidget()
        layout.addWidget(self.sidebar)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self.sidebar.currentRowChanged.connect(self.on_sidebar_row_changed)
        # Clicking the current row (Runs, while the monitor shows) must still go there.
        self.sidebar.itemClicked.connect(lambda item: self.on_sidebar_row_changed(self.sidebar.row(item)))
        self.sidebar.itemActivated.connect(lambda item: self.on_sidebar_row_changed(self.sidebar.row(item)))

    def add_page(self, page: BasePage, *, in_sidebar: bool = True) -> None:
        """Adds a page to the stack, and to the sidebar unless it is reached from another page (the monitor)."""
        self._pages[page.page_name] = page
        self.stack.addWidget(page)
        if in_sidebar:
            self._sidebar_pages.append(page.page_name)
            item = QListWidgetItem(page.title if page.page_name != "home" else "Home", self.sidebar)
            item.setIcon(icon(page.icon_name))

    def page_names(self) -> list[str]:
        """Returns the names usable with :meth:`show_page` and ``--page``: pages, then the wizard's steps."""
        return [*self._pages, *(step.step_name for step in self.wizard.steps)]

    def page(self, name: str) -> BasePage:
        """Returns the page called ``name`` (a wizard step's name gives the wizard).

        Raises:
            UnknownPageError: No such page; the message lists the pages there are.
        """
        if name in {step.step_name for step in self.wizard.steps}:
            return self.wizard
        if name not in self._pages:
            raise UnknownPageError(f"no page named {name!r}; choose one of: {', '.join(self.page_names())}")
        return self._pages[name]

    def show_page(self, name: str) -> None:
        """Switches to the page (or wizard step) called ``name`` (see :meth:`page`)."""
        page = self.page(name)
        if page is self.wizard and name != self.wizard.page_name:
            self.wizard.show_step(name)
        if page is self.monitor and self.monitor.run_id is None:
            self._show_newest_run()
        if page.page_name in self._sidebar_pages:
            self.sidebar.setCurrentRow(self._sidebar_pages.index(page.page_name))
        else:
            with QSignalBlocker(self.sidebar):  # the monitor belongs under Runs: mark it, without switching there
                self.sidebar.setCurrentRow(self._sidebar_pages.index(self.runs_page.page_name))
            self.stack.setCurrentWidget(page)
            self.sig_page_changed.emit(page.page_name)

    def _show_newest_run(self) -> None:
        runs = self.context.store.all()
        if runs:
            self.monitor.show_run(max(runs, key=lambda record: record.started).id)

    def on_run_opened(self, run_id: str) -> None:
        """Opens the monitor on a run (just launched, or picked in the runs list)."""
        self.monitor.show_run(run_id)
        self.show_page("monitor")

    async def load_pages(self, *, follow_runs: bool = True) -> None:
        """Lets every page fetch what it shows.

        Args:
            follow_runs: Also reattach to the runs that were live when the app last closed (not for screenshots).
        """
        if follow_runs:
            reattached = self.context.manager.reattach_all()
            if reattached:
                self.status_label.setText(
                    f"Reattached to {len(reattached)} live run(s); their checkpoints keep coming home."
                )
            spawn(self.check_orphans())
        await asyncio.gather(*(page.load() for page in self._pages.values()))

    def on_chat_requested(self, model: str, lora: str) -> None:
        """Opens the chat on a model picked on the Models page."""
        self.chat_page.open_model(model, lora)
        self.show_page("chat")

    def on_orphans_stopped(self, words: str) -> None:
        """Says in the status bar what terminating the orphans did."""
        self.status_label.setText(f"{words[0].upper()}{words[1:]}.")

    async def check_orphans(self) -> None:
        """Asks the providers with a key for machines no live run owns; the Home page warns of them."""
        report = await find_orphans(self.context.store, self.context.secrets)
        if report is not None:
            self.orphans_banner.show_report(report)

    def on_sidebar_row_changed(self, row: int) -> None:
        """Shows the page picked in the sidebar."""
        if row < 0:
            return
        name = self._sidebar_pages[row]
        self.stack.setCurrentWidget(self._pages[name])
        self.sig_page_changed.emit(name)

    def on_settings_changed(self, settings: Settings) -> None:
        """Applies saved preferences that take effect at once."""
        apply_theme(settings.theme)
        self.context.apply_settings(settings)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Announces the close so the app's main coroutine can finish."""
        self.sig_closed.emit()
        super().closeEvent(event)
