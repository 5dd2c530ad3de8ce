"""Ending asyncio tasks for sure: a single cancel can be lost."""

from __future__ import annotations

import asyncio
from typing import Any

#: How long a cancelled task gets to end before it is cancelled again.
CANCEL_AGAIN_S = 1.0


async def cancel_and_wait(task: asyncio.Future[Any], again_after: float = CANCEL_AGAIN_S) -> None:
    """Cancels ``task`` and waits until it has ended, cancelling it again every ``again_after`` seconds.

    asyncio.wait_for (Python 3.11) drops a cancel that meets its awaitable's result, and the task then goes on as if
    never cancelled: a drive would follow its trainer on, a heartbeat beat on, and whoever awaited them would hang.

    A task already done is left as it is.

    Raises:
        Exception: The exception the task ended with after the cancel, other than its cancellation.
    """
    if task.done():
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_after)
    if not task.cancelled() and (error := task.exception()) is not None:
        raise error
