"""Blocking work off the UI thread, for widgets that may be closed while it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import shiboken6
from PySide6.QtWidgets import QWidget

T = TypeVar("T")


async def off_ui_thread(widget: QWidget, work: Callable[..., T], *args: object) -> T:
    """Runs ``work(*args)`` in the default executor and returns its result to a widget that still exists.

    Raises:
        asyncio.CancelledError: The widget was deleted meanwhile (its window closed); the calling task just ends.
    """
    result = await asyncio.get_running_loop().run_in_executor(None, work, *args)
    if not shiboken6.isValid(widget):
        raise asyncio.CancelledError
    return result
