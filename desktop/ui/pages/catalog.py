"""The main window's pages, named without importing them.

The sidebar draws from this list at once; each page's module is imported only when the page is first built, so the
window opens before the heavy ones (charts, SSH, the run engine) load.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PageEntry:
    """One page of the main window.

    Attributes:
        name: The page's name (``--page NAME``, :meth:`MainWindow.show_page`); its class's ``page_name``.
        label: Its sidebar text.
        icon: Its sidebar icon (a Lucide name).
        module: The module holding the page's class (imported in the background at start).
        builder: The suffix of the main window's ``_build_*`` method that makes and wires the page.
        in_sidebar: False for a page reached from another page (the monitor, from Runs).
    """

    name: str
    label: str
    icon: str
    module: str
    builder: str
    in_sidebar: bool = True


PAGES: tuple[PageEntry, ...] = (
    PageEntry("home", "Home", "house", "desktop.ui.pages.home_page", "home"),
    PageEntry("new", "New fine-tune", "wand-sparkles", "desktop.ui.pages.wizard.steps", "wizard"),
    PageEntry("runs", "Runs", "list-checks", "desktop.ui.pages.runs_page", "runs"),
    PageEntry("models", "Models", "boxes", "desktop.ui.pages.models_page", "models"),
    PageEntry("chat", "Chat", "message-square", "desktop.ui.pages.chat_page", "chat"),
    PageEntry("costs", "Costs", "wallet", "desktop.ui.pages.costs_page", "costs"),
    PageEntry("settings", "Settings", "settings", "desktop.ui.pages.settings_page", "settings"),
    PageEntry("monitor", "Run monitor", "activity", "desktop.ui.pages.monitor_page", "monitor", in_sidebar=False),
)

#: The wizard's steps in order (``--page NAME`` opens the wizard there); the wizard's own list must match.
WIZARD_STEPS: tuple[str, ...] = ("data", "model", "sizing", "compute", "review")


def page_names() -> list[str]:
    """Every name ``--page`` takes: the pages, then the wizard's steps (``new`` opens the wizard where it was)."""
    return [*(entry.name for entry in PAGES), *WIZARD_STEPS]


async def warm_up() -> None:
    """Imports every page's module in a worker thread, so building the pages afterwards does not stall the UI.

    Importing defines classes only (no widget is made off the UI thread); an import that fails here fails again,
    with its real error, when the page is built.
    """
    for entry in PAGES:
        try:
            await asyncio.to_thread(importlib.import_module, entry.module)
        except Exception:  # noqa: BLE001, S112 - reported when the page is built on the UI thread
            continue
