"""The hand-off between a backend's thread and the event loop: the job it is given, the channel its
tokens come back on.

Backends (llama.cpp for whole models, the distributed pipeline for split models) run their
blocking compute in a dedicated single-thread executor, read what to do from a `GenerationJob`
(and its cancel flag), and hand token ids to the loop through `TokenChannel`; the loop side turns
them into text (node.inference.generate).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from node.inference.sampling import SamplingParams


@dataclass(eq=False)  # identity semantics: jobs live in sets
class GenerationJob:
    """One generation: prompt token ids, sampling, and a flag the loop sets to cancel it."""

    request_id: str
    prompt_tokens: list[int]
    params: SamplingParams
    max_new_tokens: int
    cancel: threading.Event = field(default_factory=threading.Event)


class TokenChannel:
    """Single-producer (a worker thread) → single-consumer (the loop) queue of token batches.

    The producer never blocks; the loop is woken at most once per batch, so a fast producer
    does not flood the loop with callbacks.
    """

    _END = object()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future | None = None
        self._wake_pending = False
        self.error: BaseException | None = None

    # --- producer side (any thread) ---

    def put(self, item: object) -> None:
        with self._lock:
            self._items.append(item)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._loop.call_soon_threadsafe(self._wake)

    def close(self, error: BaseException | None = None) -> None:
        """End of stream (optionally with the error that ended it)."""
        self.error = error
        self.put(self._END)

    # --- consumer side (loop) ---

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def batches(self) -> AsyncIterator[list]:
        """Yield lists of items as they arrive; raises the producer's error at the end."""
        while True:
            with self._lock:
                items = list(self._items)
                self._items.clear()
            if not items:
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                continue
            ended = items and items[-1] is self._END
            if ended:
                items.pop()
            if items:
                yield items
            if ended:
                if self.error is not None:
                    raise self.error
                return
