"""Who may use a loaded whole model at once: requests up to a limit, or an unload alone
(`ModelManager`'s per-model `lock`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib


class ModelSlots:
    """Who may use a loaded model: up to `limit` requests at once (`acquire`/`release`: they decode in
    one batch), or one holder alone (`exclusive()`: unload, which waits for every request to end and
    keeps new ones out meanwhile). Waiters are served first come, first served (loop thread only)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.holders = 0
        self._exclusive = False
        self._waiters: collections.deque[tuple[asyncio.Future, bool]] = collections.deque()

    def locked(self) -> bool:
        """True when a new request would wait."""
        return self._exclusive or self.holders >= self.limit or bool(self._waiters)

    async def _wait(self, exclusive: bool) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((fut, exclusive))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled before it ran: give it back
                self._give_back(exclusive)
            else:
                self._wake()
            raise

    async def acquire(self) -> None:
        if not self.locked():
            self.holders += 1
            return
        await self._wait(False)

    def release(self) -> None:
        self._give_back(False)

    def _give_back(self, exclusive: bool) -> None:
        if exclusive:
            self._exclusive = False
        else:
            if self.holders <= 0:
                raise RuntimeError("ModelSlots released more often than acquired")
            self.holders -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            fut, exclusive = self._waiters[0]
            if fut.done():  # cancelled while waiting
                self._waiters.popleft()
                continue
            if self._exclusive or (exclusive and self.holders) or (not exclusive and self.holders >= self.limit):
                return
            self._waiters.popleft()
            if exclusive:
                self._exclusive = True
            else:
                self.holders += 1
            fut.set_result(None)

    @contextlib.asynccontextmanager
    async def exclusive(self):
        """Hold the model alone (waits for the requests before it to end)."""
        if not self.locked() and self.holders == 0:
            self._exclusive = True
        else:
            await self._wait(True)
        try:
            yield
        finally:
            self._give_back(True)
