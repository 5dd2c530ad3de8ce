"""Cancelling a task for sure, even when it loses a cancel (as asyncio.wait_for can)."""

from __future__ import annotations

import asyncio

import pytest

from desktop.services.platform.tasks import cancel_and_wait


async def test_a_task_that_loses_the_first_cancel_is_cancelled_again_until_it_ends() -> None:
    lost = []

    async def loses_one_cancel() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            lost.append("first cancel")  # goes on, as a drive did when wait_for dropped the cancel
        await asyncio.sleep(60)

    task = asyncio.ensure_future(loses_one_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, again_after=0.05), 5)
    assert lost == ["first cancel"] and task.cancelled()


async def test_a_failure_while_ending_is_raised_and_a_finished_task_is_left_alone() -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("could not clean up") from None

    failing = asyncio.ensure_future(fails_when_cancelled())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="could not clean up"):
        await cancel_and_wait(failing)
    finished = asyncio.ensure_future(asyncio.sleep(0, "done"))
    await finished
    await cancel_and_wait(finished)
    assert finished.result() == "done"
