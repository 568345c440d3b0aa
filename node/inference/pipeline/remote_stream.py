"""The coordinator side of one remote generation: the holder's TOKENS in order, and its silence.

`PipelineCoordinator.start_remote` opens one per attempt whose chain is a single node holding the
model whole; `on_tokens` feeds it; the run (run.py) reads `next()`. It fails (SegmentFailed naming
the holder) on a TOKENS frame out of order (a gap or a repeat: `protocol`), when the link to the
holder drops (the coordinator's peer observer), or when the holder has been silent longer than its
budget (`tokens_deadline`): a holder sends an empty TOKENS when it has nothing else to send for
GENERATE_KEEPALIVE_S, so silence means a stalled (SIGSTOP) or lost holder, however long its prompt
or its queue. The deadline is one loop timer, re-armed lazily: it fires at the last frame + budget
and only re-schedules itself when a frame came since, so no timer work is done per frame. A
deadline that ran out while this node was itself paused (SIGSTOP, a lid closed: the loop watchdog's
`paused_since`) is pushed back by the pause, the holder's RTO untouched (the holder's frames of
that time are read after the overdue timer fires), SELF_PAUSE_REARMS times per silence at most, by
the rule a pipeline step's deadline follows (watchdog.PausePushback): until 2026-12-07 each pause gave
a silent holder a whole fresh budget, any number of times, so a coordinator stalling now and then
kept it for ever (review r25).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from node.errors import SegmentFailed
from node.inference.pipeline.remote_wire import Tokens
from node.logs import kv
from node.watchdog import PausePushback

log = logging.getLogger(__name__)


class RemoteStream:
    """TOKENS frames of one attempt's remote generation, in order, until the end or a failure."""

    def __init__(self, sid: str, holder: str, budget_s: float, on_silence: Callable[[], None] | None = None,
                 pauses: Any | None = None):
        self.sid, self.holder = sid, holder
        self.budget_s = budget_s  # the longest silence allowed between frames (and before the first)
        self.on_silence = on_silence  # e.g. back off the holder's RTO
        self.pauses = pauses  # the loop watchdog (paused_since): this node's own pauses; None: not known
        self.sent_at = self.last_at = time.monotonic()
        self.received = 0  # tokens received: the next frame's `first`
        self.ended = False  # the holder sent its end frame
        # the coordinator has what it asked for (an end-of-generation token, or max_new tokens): the
        # holder ends by itself, so the attempt's end sends it no GENERATE_CANCEL
        self.finishing = False
        self.failure: SegmentFailed | None = None
        self.pushback = PausePushback()  # this silence's deadline pushed back for this node's own pauses
        self._frames: collections.deque[Tokens] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(budget_s, self._check)

    def feed(self, msg: Tokens) -> None:
        """A TOKENS frame from the holder (loop thread, link order)."""
        if self.failure is not None or self.ended:
            return
        self.last_at = time.monotonic()
        self.pushback.reset()  # a new silence starts: the holder's whole budget
        if msg.first != self.received:
            self.fail(SegmentFailed(f"TOKENS from {self.holder[:8]} start at {msg.first}, expected {self.received}",
                                    node_id=self.holder, cause="protocol"))
            return
        if not msg.tokens and msg.end is None:
            return  # a keepalive: the holder is alive, nothing to hand on
        self.received += len(msg.tokens)
        self.ended = msg.end is not None
        self._frames.append(msg)
        self._wake()

    def fail(self, failure: SegmentFailed) -> None:
        """The generation cannot go on; `next()` raises it once the frames before it are read."""
        if self.failure is None and not self.ended:
            self.failure = failure
            self._wake()

    async def next(self) -> Tokens:
        """The next batch (or the end frame); SegmentFailed when the stream failed."""
        while not self._frames:
            if self.failure is not None:
                raise self.failure
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._frames.popleft()

    def close(self) -> None:
        """Stop the deadline (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _check(self) -> None:
        """Loop timer: fail the stream if the holder has been silent for the whole budget (and
        what this node's own pauses pushed it back by)."""
        self._timer = None
        if self.failure is not None or self.ended:
            return
        now = time.monotonic()
        silent = now - self.last_at
        due = self.last_at + self.budget_s + self.pushback.pushed
        if now < due:
            self._timer = asyncio.get_running_loop().call_later(due - now, self._check)
            return
        push = self.pushback.push(self.pauses, self.last_at, now)
        if push > 0:  # this node did not run meanwhile: not the holder's silence. The deadline moves back
            # by the pause: the holder gets the budget it had, not a fresh one, and only so often (a busy
            # or starved loop stalls often)
            log.info("DIAG: remote generate deadline ran out while this node was paused: re-armed %s", kv(
                sid=self.sid, node=self.holder[:8], silent_ms=round(silent * 1000),
                paused_ms=round(self.pushback.paused * 1000),
                pushed_ms=round(push * 1000), tokens=self.received))
            self._timer = asyncio.get_running_loop().call_later(max(0.0, due + push - now), self._check)
            return
        if self.on_silence is not None:
            self.on_silence()
        log.warning("DIAG: remote generate TIMED OUT — no TOKENS received %s",
                    kv(sid=self.sid, node=self.holder[:8], silent_ms=round(silent * 1000), tokens=self.received))
        self.fail(SegmentFailed(f"no TOKENS from {self.holder[:8]} for {silent:.1f} s", node_id=self.holder,
                                cause="tokens_deadline", since=self.last_at))
