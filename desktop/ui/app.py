"""Starting the desktop app: one Qt application, one qasync event loop, one main coroutine."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtWidgets import QApplication
from qasync import QEventLoop

from desktop import __version__
from desktop.core.settings import Settings, SettingsError, Theme
from desktop.services.platform.logs import configure_logging, get_logger
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import load_settings
from desktop.ui.background import spawn
from desktop.ui.context import AppContext
from desktop.ui.errors import ErrorReporter
from desktop.ui.main_window import MainWindow, UnknownPageError
from desktop.ui.screenshot import save_screenshot
from desktop.ui.theme import apply_theme, force_theme
from desktop.ui.widgets.blocks import install_wheel_guard

_log = get_logger("app")


@dataclass(frozen=True)
class GuiOptions:
    """How the GUI should start.

    Attributes:
        screenshot: Render the window to this PNG offscreen and exit instead of running interactively.
        page: The page to show first.
        size: Window size in logical pixels (width, height).
        scale: UI scale factor (2.0 renders as on a 200 % display).
        startup_probe: Print ``first-window`` once the window is shown and exit (used by ``make bench``).
        theme: Force light or dark for this session, whatever the settings say.
        minimized: Start in the menu bar or tray without showing the window (starting at login); where there is no
            tray, the window starts minimised.
    """

    screenshot: Path | None = None
    page: str | None = None
    size: tuple[int, int] = (1280, 800)
    scale: float = 1.0
    startup_probe: bool = False
    theme: Theme | None = None
    minimized: bool = False


class GuiStartError(RuntimeError):
    """The GUI cannot start with these options; the message says why."""


def _load_settings_or_defaults() -> tuple[Settings, str | None]:
    try:
        return load_settings(), None
    except SettingsError as exc:
        return Settings(), f"{exc}. Using default settings for now."


async def _until_exposed(window: MainWindow) -> None:
    handle = window.windowHandle()
    while handle is None or not handle.isExposed():
        await asyncio.sleep(0.005)
        handle = window.windowHandle()
    QApplication.processEvents()


async def main(options: GuiOptions) -> int:
    """The app's main coroutine: builds the window and runs until it closes (or the screenshot is written)."""
    settings, settings_problem = _load_settings_or_defaults()
    configure_logging(settings.log_level)
    _log.info("Rentune %s starting", __version__)
    force_theme(options.theme)
    apply_theme(settings.theme)
    app = QApplication.instance()
    if app is not None:
        install_wheel_guard(app)
    context = AppContext(settings, SecretStore(), read_only=options.screenshot is not None)
    window = MainWindow(settings, context.secrets, context)
    reporter = ErrorReporter(window)
    reporter.install()
    if options.page:
        window.show_page(options.page)
    window.resize(*options.size)
    closed = asyncio.Event()
    window.sig_closed.connect(closed.set)
    _show(window, options)
    if settings_problem:
        window.status_label.setText(settings_problem)
    if options.startup_probe:
        await _until_exposed(window)
        print("first-window", flush=True)
        return 0
    if options.screenshot:
        await window.load_pages(follow_runs=False)
        if options.page:
            window.show_page(options.page)
        if window.stack.currentWidget() is window.monitor:
            await window.monitor.refresh()
        await asyncio.sleep(0.2)  # let the loop lay out and paint what the page just scheduled
        save_screenshot(window, options.screenshot)
        return 0
    _keep_in_tray(window)
    load = spawn(window.load_pages())
    await closed.wait()
    load.cancel()
    await window.context.close()  # training goes on remotely; the next start reattaches
    return 0


def _show(window: MainWindow, options: GuiOptions) -> None:
    """Shows the window; started minimised, only the tray icon shows (or a minimised window, without a tray)."""
    interactive = not (options.screenshot or options.startup_probe)
    if interactive and options.minimized:
        if not window.cost_tracker.has_tray:
            window.showMinimized()
        return
    window.show()


def _keep_in_tray(window: MainWindow) -> None:
    """The running app: closing the window keeps Rentune in the tray (or asks) while something runs or bills.

    The app ends when the window announces its close, never because Qt saw the last window go.
    """
    window.cost_tracker.guard_close = True
    app = QApplication.instance()
    if isinstance(app, QApplication):
        app.setQuitOnLastWindowClosed(False)


def _require_display() -> None:
    """Fails clearly on a Linux box without a desktop session, instead of Qt aborting the process."""
    has_display = any(os.environ.get(var) for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"))
    if sys.platform.startswith("linux") and not has_display:
        raise GuiStartError(
            "no display found (DISPLAY and WAYLAND_DISPLAY are unset). Start Rentune from a desktop session, "
            "use the headless commands (rentune --help), or render a picture with rentune --screenshot FILE"
        )


def run_gui(options: GuiOptions) -> int:
    """Starts Qt and the event loop and runs :func:`main`.

    Returns:
        The process exit code.

    Raises:
        GuiStartError: There is no display, or the requested page does not exist.
    """
    if options.screenshot:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    _require_display()
    if options.scale != 1.0:
        os.environ["QT_SCALE_FACTOR"] = f"{options.scale:g}"
    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("Rentune")
    app.setApplicationVersion(__version__)
    app.setOrganizationName("Rentune")
    # asyncio.run(main(), loop_factory=QEventLoop) on Python 3.12+; asyncio.Runner is the same thing on 3.11.
    with asyncio.Runner(loop_factory=QEventLoop) as runner:
        try:
            return runner.run(main(options))
        except UnknownPageError as exc:
            raise GuiStartError(str(exc)) from exc
