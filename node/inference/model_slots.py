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
        # (future, exclusive, seats): a request with OpenAI's `n` takes its n seats at once, as llama-server
        # starts n_cmpl's slots together — one seat per choice taken one by one deadlocked (review r54: n
        # above the limit never ran, and four n=2 requests each held one seat waiting for a second)
        self._waiters: collections.deque[tuple[asyncio.Future, bool, int]] = collections.deque()

    def locked(self, seats: int = 1) -> bool:
        """True when a new request (of `seats` seats) would wait."""
        return self._exclusive or self.holders + seats > self.limit or bool(self._waiters)

    async def _wait(self, exclusive: bool, seats: int = 1) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((fut, exclusive, seats))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled before it ran: give it back
                self._give_back(exclusive, seats)
            else:
                self._wake()
            raise

    async def acquire(self, seats: int = 1) -> None:
        """`seats` seats together, first come first served (more than `limit`: never; callers refuse it)."""
        if not 1 <= seats <= self.limit:
            raise ValueError(f"{seats} seats of a model that has {self.limit}")
        if not self.locked(seats):
            self.holders += seats
            return
        await self._wait(False, seats)

    def release(self, seats: int = 1) -> None:
        self._give_back(False, seats)

    def _give_back(self, exclusive: bool, seats: int = 1) -> None:
        if exclusive:
            self._exclusive = False
        else:
            if self.holders < seats:
                raise RuntimeError("ModelSlots released more often than acquired")
            self.holders -= seats
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            fut, exclusive, seats = self._waiters[0]
            if fut.done():  # cancelled while waiting
                self._waiters.popleft()
                continue
            if self._exclusive or (exclusive and self.holders) or (not exclusive and self.holders + seats > self.limit):
                return
            self._waiters.popleft()
            if exclusive:
                self._exclusive = True
            else:
                self.holders += seats
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
