"""A request's failover bookkeeping (`Failover`, PipelineRun's base): what each failed attempt
leaves behind for the next one to be planned on.

A failed attempt (SegmentFailed) leaves its node out (`excluded`) unless the failure is excused by
this node's own pause (`_own_pause`: its peers, hearing nothing for their liveness deadline, closed
the link): then the node stays in and the attempt is not counted. A node whose link dropped or that
fell silent is remembered in `lost` (with the connection id it had) and `silent`, so that
`PipelineRun.open` waits for it and takes it back once it links again; one that its neighbour found
unreachable, in `unreached` (tried again after NEXT_HOP_RETRY_S). A node left out for how it failed
(an error, a protocol fault, a full queue) loses those entries. After MAX_ASSEMBLIES counted
failures the request fails: not counted are one kept-session miss (`_resume_missed`) and at most
MAX_ASSEMBLIES failures excused by this node's own pause, nor a node's refusal of the request's
sampling parameters (`_sampling_refused`: an older version, not a faulty one).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from node import const
from node.errors import InsufficientCapacity, Overloaded, SegmentFailed
from node.inference.pipeline.deadlines import Attempt, StepDeadlines
from node.inference.pipeline.planner import describe_chain
from node.logs import kv
from node.trace import RequestTrace

log = logging.getLogger("node.inference.pipeline.run")  # the run's lines, as before the split

# a segment that went silent (no ACK, RESULT or TOKENS in time): a dead link not yet found dead looks
# the same, so the request waits for it to link again as for a dropped link (while it stays silent)
SILENCES = ("ack_deadline", "result_deadline", "tokens_deadline")
LOST = ("link_drop", "unreachable")  # the holder is waited for until it links again (ROUTE_REGAIN_S)


class Failover:
    """Who a request's failed attempts left out, lost or excused, and whether it may go on."""

    coordinator: Any  # AttemptChannel (run.py): resume_missed
    deadlines: StepDeadlines  # its `pauses`: this node's own pauses
    trace: RequestTrace
    generated: list[int]
    attempt_no: int
    attempt: Attempt | None

    def __init__(self) -> None:
        self.excluded: set[str] = set()
        self.overloaded: SegmentFailed | None = None  # the last refusal of a holder whose queue was full
        self.resume_misses = 0  # attempts that found a kept session gone (at most one: only attempt 1 resumes)
        self.own_pauses = 0  # attempts that failed because this node was paused (not counted either)
        self.excused: dict[str, float] = {}  # node -> start of the pause its last excused failure fell in
        # nodes whose link failed this request -> the connection id it had (taken back once linked anew)
        self.lost: dict[str, int | None] = {}
        self.silent: dict[str, float] = {}  # of `lost`, those that fell silent: when (time.monotonic())
        self.unreached: dict[str, float] = {}  # found unreachable by the hop before them: when (monotonic)
        self.last_failure: str | None = None  # "<node> <cause>: <message>" of the last failed attempt
        # the last refusal of a node whose version lacks a sampling field the request uses, and how
        # many (not counted: it is older, not faulty; each one leaves out a node, so they are bounded)
        self.outdated: SegmentFailed | None = None
        self.outdated_refusals = 0


    def _resume_missed(self, att: Attempt, failure: SegmentFailed) -> None:
        """A segment no longer holds the kept session this attempt resumed (evicted, restarted):
        the same kind of chain again, prefilling the whole prompt on fresh sessions."""
        log.info("DIAG: KV-cache MISS — kept session gone on a segment, prefilling in full %s", kv(
            request_id=self.trace.request_id, reason="evicted_on_segment", kept=att.resume,
            node=failure.node_id[:8], error=failure.message))
        # kv_miss: a segment refused the kept session itself; kv_position_mismatch may be this
        # attempt's own session lost later (evicted mid-decode): a copied-from one is still whole
        self.coordinator.resume_missed(att, source_gone=failure.cause == "kv_miss")
        self.resume_misses += 1  # a new attempt (its own sid), not a failover: it does not count
        self.attempt_no += 1
        self.attempt = None

    def _sampling_refused(self, failure: SegmentFailed) -> None:
        """A node refused the request's sampling parameters (SamplingUnsupported: its version lacks
        a field or grammar type the request uses): left out of this request only, not waited for,
        and not counted toward MAX_ASSEMBLIES: another holder or chain is tried; with none left the
        client gets SamplingUnsupportedBySwarm (open). Until 2026-12-07 such a node ignored the
        field and the reply broke the request's constraint, without an error."""
        self.excluded.add(failure.node_id)
        self.lost.pop(failure.node_id, None)
        self.silent.pop(failure.node_id, None)
        self.outdated = failure
        self.outdated_refusals += 1
        log.info("DIAG: pipeline node cannot sample this request (an older version): trying another %s", kv(
            request_id=self.trace.request_id, attempt=self.attempt_no, node=failure.node_id[:8],
            error=failure.message, tokens_so_far=len(self.generated)))
        self.last_failure = f"{failure.node_id[:8]} {failure.cause}: {failure.message}"
        self.attempt_no += 1
        self.attempt = None

    def _own_pause(self, att: Attempt, failure: SegmentFailed) -> float:
        """How long this node was itself paused while the attempt was under way, just before a
        peer's link dropped or it fell silent (0: not paused, or not excused): a peer that heard
        nothing from us for its liveness deadline closed the link. Excused once per pause and node,
        MAX_ASSEMBLIES times per request at most, and only for the part of the pause after the
        attempt was opened (the loop ran then): until 2026-12-07 a peer that looked connected while
        every send to it failed at once (its link closing) was excused again and again — open, send,
        fail, excuse, none of which suspends, so the heartbeat never ran and the stall 'went on' —
        and the node spun at 100% CPU with the stream never ending (review r21)."""
        pauses = self.deadlines.pauses
        if (pauses is None or not (failure.cause in LOST or failure.cause in SILENCES
                                   or self._forwarded_by_us(att, failure))
                or self.own_pauses >= const.MAX_ASSEMBLIES):
            return 0.0
        span = pauses.last_pause(const.SELF_PAUSE_GRACE_S)
        if span is None or self.excused.get(failure.node_id) == span[0]:
            return 0.0
        start, _end, took = span
        # a silence counts only the pause after its deadline's clock started (the step sent, the
        # ACK of the hop before read, the last frame came): a step sent after the pause, to a peer
        # that never answers, is the peer's (its deadline was charged as such: deadlines.py) — until
        # 2026-12-07 it was excused, the peer neither left out nor recorded silent, and the next
        # attempt was planned on it (review r25); a later hop's counted from the step's send, before
        # a pause its own wait began after (review r28)
        since = max(att.opened, failure.since or 0.0) if failure.cause in SILENCES else att.opened
        paused = took - max(0.0, since - start)  # (a machine's sleep: its monotonic span is ~0)
        if paused < const.SELF_PAUSE_MIN_S:  # opened or sent after the pause (or during a busy loop's stall)
            return 0.0
        self.excused[failure.node_id] = span[0]
        return paused

    @staticmethod
    def _forwarded_by_us(att: Attempt, failure: SegmentFailed) -> bool:
        """A next_hop_unreachable that this node's own pause can explain: the hop that could not
        reach `failure.node_id` is this node (its own segment, `local`; or, for the first hop,
        the coordinator: this node). One between two peers (B cannot reach C) is theirs: until
        2026-12-07 it was excused too when this node had stalled a moment before (review r25)."""
        if failure.cause != "next_hop_unreachable":
            return False
        chain = [h.node_id for h in att.route]
        if failure.node_id not in chain:
            return False
        i = chain.index(failure.node_id)
        return i == 0 or att.kinds[i - 1] == "local"

    def _failed_over(self, att: Attempt, failure: SegmentFailed) -> None:
        trace = self.trace
        paused = self._own_pause(att, failure)
        if paused:  # not the peer's doing: it is not left out, and the attempt does not count
            # toward MAX_ASSEMBLIES; a new attempt (its sessions may be gone) waits for its link
            self.lost[failure.node_id] = att.links.get(failure.node_id)
            log.info("DIAG: pipeline attempt failed because this node was paused, not the peer: failing over %s", kv(
                request_id=trace.request_id, attempt=self.attempt_no, node=failure.node_id[:8],
                cause=failure.cause, paused_ms=round(paused * 1000), tokens_so_far=len(self.generated)))
            trace.note_failure("self_paused", failure.message)  # and the last failure: a 503 after the wait said no why
            self.last_failure = f"{failure.node_id[:8]} {failure.cause}: {failure.message} (after this node's own pause)"
            self.own_pauses += 1
            self.attempt_no += 1
            self.attempt = None
            return
        self.excluded.add(failure.node_id)
        if failure.cause == "next_hop_unreachable":
            self.unreached[failure.node_id] = time.monotonic()
        if failure.cause in LOST or failure.cause in SILENCES:  # taken back if it
            self.lost[failure.node_id] = att.links.get(failure.node_id)  # links again (open)
        elif failure.cause != "next_hop_unreachable":  # left out for how it failed: an earlier (excused)
            self.lost.pop(failure.node_id, None)  # failure's entry would take it back once it links
            self.silent.pop(failure.node_id, None)  # again, or speaks again
        if failure.cause in SILENCES:  # its link may be dead and not known to be yet (a Wi-Fi blip, a lid)
            self.silent[failure.node_id] = time.monotonic()
        if failure.cause == Overloaded.code:
            self.overloaded = failure
        chain = [h.node_id for h in att.plan.segments]
        standby = att.plan.standbys[chain.index(failure.node_id)] if failure.node_id in chain else None
        log.warning("DIAG: pipeline attempt failed %s", kv(
            request_id=trace.request_id, attempt=self.attempt_no, node=failure.node_id[:8], cause=failure.cause,
            error=failure.message, tokens_so_far=len(self.generated)))
        trace.note_failure(failure.cause, failure.message)
        self.last_failure = f"{failure.node_id[:8]} {failure.cause}: {failure.message}"
        if standby is not None:  # both seed 000 markers
            log.info("DIAG: failing over to standby %s", kv(request_id=trace.request_id, failed=failure.node_id[:8],
                                                            standby=describe_chain(standby, "+")))
        else:
            log.warning("DIAG: NO standby available for failed segment %s",
                        kv(request_id=trace.request_id, failed=failure.node_id[:8]))
        charged = self.attempt_no - self.resume_misses - self.own_pauses - self.outdated_refusals
        if charged >= const.MAX_ASSEMBLIES:
            if self.overloaded is not None and not self.generated:
                raise Overloaded(self.overloaded.message)
            excused = f" (and {self.own_pauses} more after this node's own pause)" if self.own_pauses else ""
            raise InsufficientCapacity(f"the pipeline failed {charged} times{excused}; last: {failure.message}")
        self.attempt_no += 1
        self.attempt = None
