"""The engine contract every backend implements, and the thread → loop token hand-off.

Backends (llama.cpp for whole models, the torch slice pipeline for split models) run their
blocking compute in a dedicated single-thread executor and hand token ids to the event loop
through `TokenChannel`; the loop side turns them into text (node.inference.generate).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

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


class Engine(Protocol):
    """What the generation layer needs from a backend that holds a whole model's head."""

    model_id: str
    n_ctx: int
    chat_template: str | None
    bos_text: str
    eos_text: str

    def tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        """Token ids of `text` (special tokens in the text are parsed). Fast; may block briefly."""

    def piece(self, token_id: int) -> bytes:
        """The bytes a token contributes to the text (b"" for control tokens)."""

    def is_eog(self, token_id: int) -> bool:
        """True for end-of-generation tokens (EOS, end of turn)."""

    @property
    def add_bos(self) -> bool:
        """Whether prompts start with BOS for this model."""

    def generate(self, job: GenerationJob, channel: TokenChannel) -> None:
        """Blocking: sample up to job.max_new_tokens tokens, put each id on the channel, close it."""
