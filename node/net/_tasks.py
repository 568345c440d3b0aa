"""The peer network's background tasks (dials, loops, inbound handshakes, handler tasks).

One `Tasks` per PeerManager, handed to every part that starts work of its own: all of it is
cancelled together at stop, a task that fails is logged, and `stopping` tells loops to end and
dialers, savers and relay clients to start nothing new.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger(__name__)


class Tasks:
    """Background tasks owned by one peer manager, and whether it is stopping."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.stopping = False

    def spawn(self, coro: Awaitable[Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run a background task (cancelled by `async_cancel_all`)."""
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        if name:
            task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    async def async_cancel_all(self) -> None:
        """Cancel every task and wait until they have ended."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("peer network task %s failed", task.get_name(), exc_info=exc)
