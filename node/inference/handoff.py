"""The hand-off between a backend's thread and the event loop: the job it is given, the channel its
tokens come back on.

Backends (llama.cpp for whole models, the distributed pipeline for split models) run their
blocking compute in a dedicated single-thread executor, read what to do from a `GenerationJob`
(and its cancel flag), and hand token ids to the loop through `TokenChannel`; the loop side turns
them into text (node.inference.generate). When the job asks for logprobs (`params.logprobs` not None)
each token comes with its `TokenScores` (ids and numbers only: the loop side turns ids into text),
and the batches are `TokenBatch`es carrying them; otherwise they are plain lists of ids.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from node.inference.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class TokenScores:
    """One sampled token's log-probability under the model's distribution (the log-softmax of the
    logits, before any sampling step), and the `len(top_ids)` most likely tokens, best first."""

    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


class TokenBatch(list):
    """A batch of token ids (it is the list) with their `scores`, one per token, when logprobs were
    asked; sources yield plain lists otherwise (no cost when logprobs are off)."""

    __slots__ = ("scores",)

    def __init__(self, tokens=(), scores: list[TokenScores] | None = None):
        super().__init__(tokens)
        self.scores = scores


def batch_scores(batch: list) -> list[TokenScores] | None:
    """The scores a batch carries (None for a plain list)."""
    return batch.scores if isinstance(batch, TokenBatch) else None


@dataclass(eq=False)  # identity semantics: jobs live in sets
class GenerationJob:
    """One generation: prompt token ids, sampling, and a flag the loop sets to cancel it."""

    request_id: str
    prompt_tokens: list[int]
    params: SamplingParams
    max_new_tokens: int
    cancel: threading.Event = field(default_factory=threading.Event)
    # set before `cancel` when the reply is complete rather than abandoned (a stop sequence matched):
    # the engine keeps its sequence's KV cached for the conversation's next turn
    keep_kv: bool = False
    # the reply's tokens already produced before this job (the prompt's tail after a failover): an
    # output grammar replays them
    history: tuple[int, ...] = ()
    cached_tokens: int = 0  # prompt tokens the engine found in its KV cache (set before the first token)
    # the choices of one request (OpenAI's `n`) share it: the batch engine starts one from a copy of
    # another's prefilled prompt, not a prefill of its own ("" : none)
    group: str = ""


class TokenChannel:
    """Single-producer (a worker thread) → single-consumer (the loop) queue of token batches.

    The producer never blocks; the loop is woken at most once per batch, so a fast producer
    does not flood the loop with callbacks.
    """

    _END = object()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._scores: collections.deque[TokenScores] = collections.deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future | None = None
        self._wake_pending = False
        self.error: BaseException | None = None

    # --- producer side (any thread) ---

    def put(self, item: object, scores: TokenScores | None = None) -> None:
        """One token id (with its scores when logprobs are asked: then for every token)."""
        with self._lock:
            self._items.append(item)
            if scores is not None:
                self._scores.append(scores)
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
        """Yield lists of items as they arrive (`TokenBatch`es when they came with scores); raises
        the producer's error at the end."""
        while True:
            with self._lock:
                items = list(self._items)
                self._items.clear()
                scores = None
                if self._scores:
                    scores = list(self._scores)
                    self._scores.clear()
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
                yield items if scores is None else TokenBatch(items, scores)
            if ended:
                if self.error is not None:
                    raise self.error
                return
