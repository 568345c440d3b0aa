"""Locks by key: one asyncio.Lock per key (a path, a digest, a directory), forgotten once nobody
holds or waits for it, so a long-running node does not keep one per key it ever saw."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class KeyedLocks:
    """`async with locks.hold(key):` runs one holder of a key at a time; other keys run at once."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """Keys held or waited for now."""
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable | None) -> AsyncIterator[None]:
        """Hold the lock of `key` (None: nothing to hold)."""
        if key is None:
            yield
            return
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:  # (counted: a lock just released still has a waiter about to take it)
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
