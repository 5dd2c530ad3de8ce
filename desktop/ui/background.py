"""Blocking work off the UI thread, for widgets that may be closed while it runs."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

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


def spawn(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Starts background UI work whose failure must not vanish: errors go to the app's error reporter."""
    task = asyncio.ensure_future(coroutine)
    task.add_done_callback(_report_failure)
    return task


def _report_failure(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        sys.excepthook(type(error), error, error.__traceback__)
