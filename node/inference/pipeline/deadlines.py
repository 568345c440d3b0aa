"""A step's one future and the ACK/RESULT deadlines that guard it.

A step (a prefill chunk or one decode token) is resolved exactly once, through `Step.result`: by
its RESULT (coordinator.py), by a dropped link to a chain member (`Attempt.fail`, from the peer
observer), or by the deadline timer here. The waited step's deadline is one loop timer, re-armed by
each ACK; the request's task is not woken per ACK (the done-ACK rule with a task wake-up cost the
coordinator's loop 0.11 ms per token, the timer 0.05 ms).

Hop 0's ACK is due one ACK budget, `max(ACK_DEADLINE_MIN_S, RTO) + ACK_HOLD_S`, after sending; hop
i's one budget after hop i-1's ACK when that ACK came with i-1's output already on its way (`done`),
else after hop i-1's ACK plus its compute allowance; the RESULT likewise after the last ACK. RTT
samples for the RFC 6298 estimator come from hop 0's ACKs of one-token steps, less the time the ACK
was held; a miss backs that peer's RTO off (the same estimator the pings feed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from node import const
from node.errors import SegmentFailed
from node.inference.pipeline.perf import PeerPerformance
from node.inference.pipeline.planner import Plan
from node.inference.pipeline.wire import Ack, Hop, Result
from node.logs import kv
from node.trace import RequestTrace
from node.watchdog import PausePushback

log = logging.getLogger(__name__)


@dataclass
class Step:
    """One WORK sent to segment 0 and what came back of it so far."""

    seq: int
    n_tokens: int
    sent_at: float
    result: asyncio.Future  # the step's one future: a Result or a SegmentFailed
    acks: dict[int, tuple[float, bool]] = field(default_factory=dict)  # hop -> (when, its output had left)
    timer: asyncio.TimerHandle | None = None  # the pending deadline of a step being waited for
    trace: RequestTrace | None = None  # set while waited for (deadline log lines)
    armed: tuple[float, float] = (0.0, 0.0)  # (when, for how long) the pending deadline was set
    pushback: PausePushback = field(default_factory=PausePushback)  # for this node's own pauses, per step
    clock: float = 0.0  # when the pending deadline's clock started (sent_at, or the ACK it runs from was read)

    def disarm(self) -> None:
        """Cancel the pending deadline, if any."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


@dataclass
class Attempt:
    """One route's try at a request: a KV session per segment under `sid`, its steps in flight."""

    sid: str
    model_sha: str
    plan: Plan
    route: tuple[Hop, ...]
    kinds: list[str]  # transport per hop: local | direct | relayed
    failed: asyncio.Future  # set once by `fail`: every later wait raises it
    steps: dict[int, Step] = field(default_factory=dict)
    next_seq: int = 0
    kv_len: int | None = None  # KV length segment 0 reported after the last completed step
    resume: str | None = None  # prefix reuse: the kept session this one starts as (first WORK)
    cached: int = 0  # ... holding this many of the prompt's tokens (prefill starts here)
    resume_copy: bool = False  # ... as a copy: the kept session stays kept (a shared system prompt)
    links: dict[str, int | None] = field(default_factory=dict)  # node -> connection id of its link when planned
    opened: float = field(default_factory=time.monotonic)  # when planned: the loop ran then (failover.py _own_pause)

    def nodes(self) -> set[str]:
        """The nodes of the chain."""
        return {h.node_id for h in self.route}

    def fail(self, failure: SegmentFailed) -> None:
        """The attempt cannot go on (a chain member's link dropped): resolve every pending step."""
        if self.failed.done():
            return
        self.failed.set_result(failure)
        for step in self.steps.values():
            if not step.result.done():
                step.result.set_result(failure)


class StepDeadlines:
    """Arms, re-arms and fires the waited step's deadline; feeds and backs off peers' RTOs."""

    def __init__(self, node_id: str, peers: Any | None, perf: PeerPerformance, pauses: Any | None = None):
        self.node_id = node_id
        self.peers = peers  # PeerManager: rto(node_id) per peer; None without a peer network
        self.perf = perf
        # the loop watchdog (paused_since, last_pause): this node's own pauses; None: not known
        self.pauses = pauses

    def _rto(self, node_id: str):
        return self.peers.rto(node_id) if self.peers is not None else None

    async def wait(self, att: Attempt, step: Step, trace: RequestTrace) -> Result:
        """The step's RESULT (which may report an error); SegmentFailed on a dropped link or a
        missed deadline."""
        if att.failed.done():
            raise att.failed.result()
        step.trace = trace
        self.arm(att, step)
        try:
            outcome = await step.result
        finally:
            step.disarm()
        if isinstance(outcome, SegmentFailed):
            raise outcome
        return outcome

    def acked(self, att: Attempt, step: Step, ack: Ack, sender: str) -> None:
        """An ACK for a pending step: the next deadline, and an RTT sample when it is one."""
        now = time.monotonic()
        step.acks[ack.hop] = (now, ack.done)
        if step.timer is not None:
            self.arm(att, step)  # the next deadline (a done ACK brings it forward)
        rto = self._rto(sender)
        if rto is not None and ack.hop == 0 and sender != self.node_id and step.n_tokens == 1:
            # (one token: no prefill chunk travelling ahead of the ACK on a shared link)
            # coordinator → segment 0 → coordinator is a true round trip, less the time the ACK was held
            rto.observe(max(0.0, now - step.sent_at - ack.held_us / 1e6))

    def arm(self, att: Attempt, step: Step) -> None:
        """(Re)schedule the step's earliest pending deadline."""
        deadline, hop, what, step.clock = self.deadline(att, step)
        step.disarm()
        now = time.monotonic()
        step.armed = (now, max(0.0, deadline - now))
        step.timer = asyncio.get_running_loop().call_later(step.armed[1], self._expire, att, step, hop, what)

    def deadline(self, att: Attempt, step: Step) -> tuple[float, int, str, float]:
        """(time, hop, what, since) of the earliest deadline still pending for this step; `since`:
        when its clock started, the loop running then (the step sent, or the ACK it runs from read)."""
        basis = since = step.sent_at
        for i, hop in enumerate(att.route):
            got = step.acks.get(i)
            if got is None:
                if att.kinds[i] != "local":
                    return basis + self.ack_budget(hop.node_id), i, "ack", since
                got = (basis, False)  # our own hop, still computing: no message to miss
            else:
                since = got[0]
            acked, done = got
            # an ACK sent with the step's output starts the next hop's clock; an earlier one (a
            # slow step, after ACK_HOLD_S) leaves the step its compute allowance first
            basis = acked if done else acked + self.compute_allowance(hop, step.n_tokens)
        last = att.route[-1].node_id
        # our own last hop: its RESULT follows its ACK within a loop pass; a margin, not a race
        margin = const.ACK_HOLD_S if att.kinds[-1] == "local" else self.ack_budget(last)
        return basis + margin, len(att.route) - 1, "result", since

    def ack_budget(self, node_id: str) -> float:
        """How long an ACK from this node may take: its RTO (or the initial one), at least the
        minimum, plus the hold a segment may put on its ACK."""
        rto = self._rto(node_id)
        # a segment may hold its ACK for ACK_HOLD_S (it rides with the output of a quick step)
        return max(const.ACK_DEADLINE_MIN_S, rto.rto_s if rto is not None else const.RTO_INITIAL_S) + const.ACK_HOLD_S

    def compute_allowance(self, hop: Hop, n_tokens: int) -> float:
        """Time a hop may compute after its early ACK: a multiple of its estimated compute."""
        per_layer = self.perf.ms_per_layer(hop.node_id) or 5.0
        return max(const.STEP_COMPUTE_MIN_S, const.STEP_COMPUTE_FACTOR * per_layer * (hop.end - hop.start) * n_tokens / 1000)

    def _expire(self, att: Attempt, step: Step, hop: int, what: str) -> None:
        """Loop timer: a deadline passed with nothing from the hop it waited for."""
        step.timer = None
        if step.result.done():
            return
        trace = step.trace
        node = att.route[hop].node_id
        armed_at, span = step.armed
        now = time.monotonic()
        push = step.pushback.push(self.pauses, armed_at, now)
        if push > 0:  # this node was paused (SIGSTOP, a lid closed) while it waited: not the peer's
            # silence; its frames of that time came first in this loop pass. The deadline moves back by
            # the pause (on the monotonic clock, which a machine's sleep did not advance), the budget it
            # had, SELF_PAUSE_REARMS times per step at most (watchdog.PausePushback)
            log.info("DIAG: pipeline deadline ran out while this node was paused: re-armed %s", kv(
                request_id=trace.request_id if trace else None, seq=step.seq, hop=hop, node=node[:8],
                what=what, paused_ms=round(step.pushback.paused * 1000), pushed_ms=round(push * 1000)))
            step.armed = (now, max(0.0, armed_at + span + push - now))
            step.timer = asyncio.get_running_loop().call_later(step.armed[1], self._expire, att, step, hop, what)
            return
        rto = self._rto(node)
        if rto is not None:
            rto.backoff()
        if what == "ack":  # both seed 000 markers
            log.warning("DIAG: tensor forward not acknowledged within the ACK deadline %s",
                        kv(request_id=trace.request_id, sid=att.sid, seq=step.seq, hop=hop, node=node[:8]))
        else:
            log.warning("DIAG: segment TIMED OUT — no result received %s",
                        kv(request_id=trace.request_id, sid=att.sid, seq=step.seq, node=node[:8]))
        step.result.set_result(SegmentFailed(f"no {what.upper()} from {node[:8]} within the deadline", node_id=node,
                                             cause=f"{what}_deadline", since=step.clock or step.sent_at))
