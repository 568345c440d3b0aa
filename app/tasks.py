"""Starting coroutines from Qt slots: the task is kept alive and its failure reported, never lost."""

from __future__ import annotations

import asyncio
import logging

from node.errors import NodeError

log = logging.getLogger(__name__)

_TASKS: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks


def spawn(coro, *, what: str, on_error=None) -> asyncio.Task:
    """Run a coroutine on the loop from a Qt slot; failures are logged and reported, never lost."""
    task = asyncio.ensure_future(coro)
    _TASKS.add(task)

    def done(t: asyncio.Task) -> None:
        _TASKS.discard(t)
        if t.cancelled():
            return
        exc = t.exception()
        if exc is None:
            return
        message = exc.message if isinstance(exc, NodeError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, NodeError):
            log.warning("%s failed: %s", what, message)
        else:
            log.error("%s failed", what, exc_info=exc)
        if on_error is not None:
            on_error(f"{what} failed: {message}")

    task.add_done_callback(done)
    return task
