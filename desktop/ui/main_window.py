"""The main window: a sidebar of pages, the page stack, and a status bar."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QByteArray, QSize, Signal
from PySide6.QtGui import QCloseEvent, QIcon, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QMainWindow, QStackedWidget, QWidget

from desktop import __version__
from desktop.core.settings import Settings
from desktop.services.resources import ResourceNotFoundError, resource_bytes
from desktop.services.secrets import SecretStore
from desktop.ui.pages.base import BasePage
from desktop.ui.pages.home_page import HomePage
from desktop.ui.pages.settings_page import SettingsPage
from desktop.ui.theme import apply_theme


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

    def __init__(self, settings: Settings, secrets: SecretStore) -> None:
        super().__init__()
        self.setWindowTitle(f"Rentune {__version__}")
        self.setWindowIcon(app_icon())
        self.setObjectName("main_window")
        self.setAccessibleName("Rentune")
        self.resize(1280, 800)
        self.setMinimumSize(QSize(900, 600))
        self._pages: dict[str, BasePage] = {}
        self._build_layout()
        self.add_page(HomePage())
        settings_page = SettingsPage(settings, secrets)
        settings_page.sig_settings_changed.connect(self.on_settings_changed)
        self.add_page(settings_page)
        self.sidebar.setCurrentRow(0)
        self.status_label = QLabel("Ready. No machine is rented.")
        self.statusBar().addWidget(self.status_label, 1)

    def _build_layout(self) -> None:
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.sidebar = QListWidget()
        self.sidebar.setObjectName("sidebar")
        self.sidebar.setAccessibleName("Sections")
        self.sidebar.setFixedWidth(200)
        self.sidebar.setStyleSheet("QListWidget#sidebar::item { padding: 8px 12px; }")
        self.stack = QStackedWidget()
        layout.addWidget(self.sidebar)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self.sidebar.currentRowChanged.connect(self.on_sidebar_row_changed)

    def add_page(self, page: BasePage) -> None:
        """Adds a page to the stack and the sidebar."""
        self._pages[page.page_name] = page
        self.stack.addWidget(page)
        QListWidgetItem(page.title if page.page_name != "home" else "Home", self.sidebar)

    def page_names(self) -> list[str]:
        """Returns the names usable with :meth:`show_page` and ``--page``, in sidebar order."""
        return list(self._pages)

    def page(self, name: str) -> BasePage:
        """Returns the page called ``name``.

        Raises:
            UnknownPageError: No such page; the message lists the pages there are.
        """
        if name not in self._pages:
            raise UnknownPageError(f"no page named {name!r}; choose one of: {', '.join(self._pages)}")
        return self._pages[name]

    def show_page(self, name: str) -> None:
        """Switches to the page called ``name`` (see :meth:`page`)."""
        self.sidebar.setCurrentRow(self.stack.indexOf(self.page(name)))

    async def load_pages(self) -> None:
        """Lets every page fetch what it shows, concurrently, without blocking the UI."""
        await asyncio.gather(*(page.load() for page in self._pages.values()))

    def on_sidebar_row_changed(self, row: int) -> None:
        """Shows the page picked in the sidebar."""
        if row < 0:
            return
        self.stack.setCurrentIndex(row)
        self.sig_page_changed.emit(self.page_names()[row])

    def on_settings_changed(self, settings: Settings) -> None:
        """Applies saved preferences that take effect at once."""
        apply_theme(settings.theme)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Announces the close so the app's main coroutine can finish."""
        self.sig_closed.emit()
        super().closeEvent(event)
