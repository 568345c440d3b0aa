"""Waiting for a condition with a deadline: the one way tests wait (never a fixed sleep).

A timeout names what was awaited, so a failing test says which step never happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_INTERVAL_S = 0.05


async def wait_until(predicate: Callable[[], object], timeout_s: float = DEFAULT_TIMEOUT_S,
                     interval_s: float = DEFAULT_INTERVAL_S, what: str = "condition"):
    """Poll predicate() (sync, or returning an awaitable) on the running loop until it is truthy;
    returns that value, or raises AssertionError naming `what` once `timeout_s` has passed.

    The predicate is evaluated once more after the deadline before giving up, so a slow poll
    never loses a condition that came true during the last sleep."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)


def wait_until_sync(predicate: Callable[[], object], timeout_s: float = DEFAULT_TIMEOUT_S,
                    interval_s: float = DEFAULT_INTERVAL_S, what: str = "condition"):
    """Blocking wait_until, for tests without a loop (subprocess nodes, hypothesis, plain threads).
    Never call it on a running loop: it sleeps the thread."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
